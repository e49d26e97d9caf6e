"""dbt adapter for ClearIce (Arrow Flight SQL over ADBC)."""
from dbt.adapters.base import AdapterPlugin

from dbt.adapters.clearice.connections import ClearIceConnectionManager, ClearIceCredentials
from dbt.adapters.clearice.impl import ClearIceAdapter
from dbt.include import clearice

__all__ = ["ClearIceAdapter", "ClearIceConnectionManager", "ClearIceCredentials", "Plugin"]

Plugin = AdapterPlugin(
    adapter=ClearIceAdapter,
    credentials=ClearIceCredentials,
    include_path=clearice.PACKAGE_PATH,
)
