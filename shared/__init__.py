"""Leaf helpers both ARCA and the node use: INI config, token packing, logging."""
