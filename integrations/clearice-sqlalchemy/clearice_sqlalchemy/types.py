"""Arrow types (what ClearIce's Flight SQL schemas carry) as SQLAlchemy types."""

import pyarrow as pa
from sqlalchemy import types as sqltypes


def sql_type(t: pa.DataType) -> sqltypes.TypeEngine:
    """The SQLAlchemy type of an Arrow type (`DECIMAL(12, 2)`, `TIMESTAMP`, ...)."""
    if pa.types.is_boolean(t):
        return sqltypes.BOOLEAN()
    if pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t):
        return sqltypes.SMALLINT()
    if pa.types.is_int32(t) or pa.types.is_uint16(t):
        return sqltypes.INTEGER()
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return sqltypes.BIGINT()
    if pa.types.is_uint64(t):
        return sqltypes.NUMERIC(20, 0)
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return sqltypes.REAL()
    if pa.types.is_float64(t):
        return sqltypes.FLOAT(precision=53)
    if pa.types.is_decimal(t):
        return sqltypes.DECIMAL(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or _is(t, "is_string_view"):
        return sqltypes.VARCHAR()
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_fixed_size_binary(t)
        or _is(t, "is_binary_view")
    ):
        return sqltypes.VARBINARY()
    if pa.types.is_date(t):
        return sqltypes.DATE()
    if pa.types.is_timestamp(t):
        return sqltypes.TIMESTAMP(timezone=t.tz is not None)
    if pa.types.is_time(t):
        return sqltypes.TIME()
    # durations and intervals have no SQLAlchemy type that is not a DATETIME underneath
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return sqltypes.ARRAY(sql_type(t.value_type))
    if pa.types.is_struct(t) or pa.types.is_map(t):
        return sqltypes.JSON()
    if pa.types.is_dictionary(t):
        return sql_type(t.value_type)
    return sqltypes.NullType()


def type_name(t: pa.DataType) -> str:
    """The SQL name of an Arrow type, as Superset shows it (`DECIMAL(22, 2)`)."""
    st = sql_type(t)
    if isinstance(st, sqltypes.ARRAY):
        return f"ARRAY<{type_name(t.value_type)}>"
    if isinstance(st, sqltypes.TIMESTAMP) and st.timezone:
        return "TIMESTAMP WITH TIME ZONE"
    if isinstance(st, sqltypes.FLOAT):
        return "DOUBLE"
    if isinstance(st, sqltypes.NullType):
        return str(t).upper()
    return str(st.compile())


def _is(t: pa.DataType, predicate: str) -> bool:
    f = getattr(pa.types, predicate, None)
    return bool(f and f(t))
