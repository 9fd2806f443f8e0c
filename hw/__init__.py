"""coda.hw"""
