"""The version of polaformer_mm."""
__version__ = '0.1.0'
