"""`python -m proving.fuzz`: generated raw messages through a real worker, each accounted for."""
