"""How the core is compiled (none of the rules): numba's compiler and its patches, the state
passed by reference, the lazy functions' entries, the families' cache groups, the extension
modules built ahead of time."""
