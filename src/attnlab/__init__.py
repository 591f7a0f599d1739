"""attnlab: learn, verify and use attention."""

__version__ = "0.1.0"
