"""coda.cosim"""
