"""coda.synth"""
