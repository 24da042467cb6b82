"""The figures ``pagesim reproduce`` knows, in the order ``all`` runs them: their names alone,
for the command line's parser, which should not load the figures themselves (pandas and the
sweeps: ``experiments/figures/``, whose registry is built from these names)."""

FIGURE_NAMES = ("fig2", "fig13", "fig15", "fig12", "fig18b", "fig14", "fig16", "fig17", "fig19", "distserve", "hybrid")
