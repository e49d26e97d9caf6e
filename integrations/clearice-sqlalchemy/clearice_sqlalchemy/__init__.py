"""SQLAlchemy dialect (`clearice://`) and Superset engine spec for ClearIce.

The dialect speaks Arrow Flight SQL through ADBC (`adbc_driver_flightsql`); every statement
runs as the URL's principal under ClearIce's policy."""

__version__ = "0.1.0"
