"""coda.experiments: the commands that combine the layers below. ``coda run`` (run), ``coda
nme run`` (nme_run), profiling, schedule search and evaluation of the cache (profile,
search, step_plans, rollouts, evaluate, metrics, dra_calibration), ``coda bench`` and the DIMM-NMP
design-space study that reads cosimulation and synthesis results (bench, design_space,
design_space_report, synth_area, area_sweep)."""
