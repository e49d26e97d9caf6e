"""The ClearIce adapter: DataFusion's SQL over Iceberg catalogs, under ClearIce's policy."""
from typing import List

import agate
from dbt.adapters.base.meta import available
from dbt.adapters.sql import SQLAdapter

from dbt.adapters.clearice.connections import ClearIceConnectionManager


class ClearIceAdapter(SQLAdapter):
    ConnectionManager = ClearIceConnectionManager

    @classmethod
    def date_function(cls) -> str:
        return "now()"

    @classmethod
    def is_cancelable(cls) -> bool:
        return True

    @available
    def valid_incremental_strategies(self) -> List[str]:
        return ["append", "merge", "insert_overwrite"]

    @classmethod
    def convert_text_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        return "VARCHAR"

    @classmethod
    def convert_number_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        decimals = agate_table.aggregate(agate.MaxPrecision(col_idx))
        return "DOUBLE" if decimals else "BIGINT"

    @classmethod
    def convert_integer_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        return "BIGINT"

    @classmethod
    def convert_boolean_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        return "BOOLEAN"

    @classmethod
    def convert_datetime_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        return "TIMESTAMP"

    @classmethod
    def convert_date_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        return "DATE"

    @classmethod
    def convert_time_type(cls, agate_table: agate.Table, col_idx: int) -> str:
        return "TIME"
