"""The video DiT of CODA: moving-digit data, the trained Latte model, and its classifier."""
