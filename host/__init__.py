"""coda.host"""
