"""coda.host.cache: cross-timestep caching of a diffusers video transformer. The engine
(diffusers hooks, decisions, segments, CFG interleaving), the operator-event stream (events),
schedules (schedule) and the shipped ones (shipped), one adapter per architecture (arch/),
one file per policy (policies/) and the quality proxy's weights (weights)."""
