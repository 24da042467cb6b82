"""The cost models: how long an engine step takes, the constants they read and the measured
timings those are fitted on. Each model's step price is stated once in the core
(``sim/core/price/cost.py``, ``cost_calibrated.py``, ``cost_table.py``); these files derive its
constants and price a batch outside a run.

    roofline.py         the roofline (formulas and constants in its docstring) and the table
                        model over a measured profile
    calibrated.py       the calibrated roofline: the roofline plus the terms measured kernels show
    serving.py          the serving model: the roofline's constants fitted on real serving runs
    regime.py           the serving model's band by an answer's regime, from the real runs'
                        held-out errors (sim/data/serving/regimes.toml)
    achieved.py         what another GPU achieves against the fitted one, measured per operation
                        (sim/data/serving/achieved.toml), which the serving model scales by
    achieved_fit.py     those ratios computed from the measured timings (benchmarks/gpu_achieved.py)
    models.py           the cost model a configuration names, scaled or not, as the core takes it
    calibration.py      the calibrated roofline's constants per GPU (sim/data/calibration), and
                        each model's measured error band
    calibration_fit.py  the fit of those constants on measured timings (pagesim cost fit)
    measured.py         Vidur's measured GPU timings read into tables, and the cells they measure
    cpu_overheads.py    vLLM's CPU time per iteration (Vidur's table), fitted per TP degree
    error.py            a cost model's error against measured cells (pagesim cost error)
    profile_format.py   the profile CSV the table model reads (written by pagesim cost import
                        and gpu calibrate)
    cli.py              ``pagesim cost``: error, fit, import, bands
"""
