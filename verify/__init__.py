"""coda.verify: verification beside the synthesis flow. Mutation testing of the NME (mutation,
mutation_proof, mutation_arguments.toml) and simulation of synthesised netlists against the
RTL's reference (netlist_sim)."""
