"""R³ — Record-Remix-Replay: end-to-end GPU kernel tuning from recorded launches."""

__version__ = "0.1.0"
