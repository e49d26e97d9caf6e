"""Connections: one ADBC Flight SQL connection per dbt thread, logged in as the profile's
principal. Every statement ClearIce runs commits on its own (one Iceberg snapshot), so
dbt's BEGIN/COMMIT are not sent."""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional, Tuple

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa
from dbt.adapters.contracts.connection import AdapterResponse, ConnectionState, Credentials
from dbt.adapters.events.logging import AdapterLogger
from dbt.adapters.sql import SQLConnectionManager
from dbt_common.exceptions import DbtDatabaseError, DbtRuntimeError

logger = AdapterLogger("ClearIce")


@dataclass
class ClearIceCredentials(Credentials):
    """Profile `type: clearice`: `host`, `port`, `user` + `password` or `token`, `tls`
    (with `tls_root_certs`, a PEM file, for a private CA), `catalog` (dbt's `database`) and
    `schema`."""

    host: str = "127.0.0.1"
    port: int = 50051
    user: Optional[str] = None
    password: Optional[str] = None
    token: Optional[str] = None
    tls: bool = False
    tls_root_certs: Optional[str] = None

    _ALIASES = {"catalog": "database", "username": "user", "pass": "password"}

    @property
    def type(self) -> str:
        return "clearice"

    @property
    def unique_field(self) -> str:
        return f"{self.host}:{self.port}"

    def _connection_keys(self) -> Tuple[str, ...]:
        return ("host", "port", "user", "database", "schema", "tls")

    def uri(self) -> str:
        return f"{'grpc+tls' if self.tls else 'grpc'}://{self.host}:{self.port}"

    def db_kwargs(self) -> dict:
        kwargs = {}
        if self.token:
            kwargs["adbc.flight.sql.authorization_header"] = f"Bearer {self.token}"
        elif self.user is not None:
            kwargs["username"] = self.user
            kwargs["password"] = self.password or ""
        else:
            raise DbtRuntimeError("clearice profile: give `user` and `password`, or `token`")
        if self.tls_root_certs:
            with open(self.tls_root_certs, encoding="utf-8") as f:
                kwargs["adbc.flight.sql.client_option.tls_root_certs"] = f.read()
        return kwargs


class ClearIceCursor:
    """A DB-API cursor that runs each statement to its end when it is executed.

    ClearIce runs a statement when its result is read (Flight SQL's DoGet), and dbt does not
    read the results of DDL and writes: an ADBC cursor left unread would only have planned
    them. The result is kept (dbt's results are small: row counts, tests, metadata)."""

    def __init__(self, cursor):
        self._cursor = cursor
        self._rows = []
        self.description = None
        self.rowcount = -1

    def execute(self, sql: str, bindings: Optional[Any] = None):
        if bindings:
            self._cursor.execute(sql, parameters=list(bindings))
        else:
            self._cursor.execute(sql)
        table = self._cursor.fetch_arrow_table()
        # the type code is the Arrow type (named by `data_type_code_to_name`)
        self.description = [(f.name, f.type, None, None, None, None, f.nullable) for f in table.schema]
        self._rows = [tuple(r.values()) for r in table.to_pylist()]
        # A write reports its row count as one `count` value.
        if table.schema.names == ["count"] and table.num_rows == 1:
            self.rowcount = int(table.column(0)[0].as_py() or 0)
        else:
            self.rowcount = table.num_rows
        return self

    def fetchall(self):
        rows, self._rows = self._rows, []
        return rows

    def fetchmany(self, size: int):
        rows, self._rows = self._rows[:size], self._rows[size:]
        return rows

    def fetchone(self):
        return self._rows.pop(0) if self._rows else None

    def close(self):
        self._cursor.close()


class ClearIceHandle:
    """The ADBC connection, handing out [`ClearIceCursor`]s."""

    def __init__(self, conn):
        self.adbc = conn

    def cursor(self):
        return ClearIceCursor(self.adbc.cursor())

    def close(self):
        self.adbc.close()

    def commit(self):
        pass

    def rollback(self):
        pass


class ClearIceConnectionManager(SQLConnectionManager):
    TYPE = "clearice"

    @classmethod
    def open(cls, connection):
        if connection.state == ConnectionState.OPEN:
            return connection
        creds = connection.credentials
        try:
            connection.handle = ClearIceHandle(
                flightsql.connect(creds.uri(), db_kwargs=creds.db_kwargs(), autocommit=True)
            )
            connection.state = ConnectionState.OPEN
        except adbc_driver_manager.Error as e:
            connection.handle = None
            connection.state = ConnectionState.FAIL
            raise DbtDatabaseError(f"ClearIce at {creds.uri()}: {str(e).strip()}") from e
        return connection

    @contextmanager
    def exception_handler(self, sql: str):
        try:
            yield
        except adbc_driver_manager.Error as e:
            logger.debug(f"ClearIce error: {e}")
            raise DbtDatabaseError(str(e).strip()) from e
        except DbtRuntimeError:
            raise
        except Exception as e:  # noqa: BLE001 - anything else names itself
            raise DbtRuntimeError(f"{type(e).__name__}: {e}") from e

    def cancel(self, connection):
        handle = connection.handle
        if handle is not None:
            try:
                handle.adbc.adbc_connection.cancel()
            except Exception as e:  # noqa: BLE001 - best effort: the query may have ended
                logger.debug(f"cancel: {e}")

    @classmethod
    def data_type_code_to_name(cls, type_code: Any) -> str:
        """The SQL name of a result column's Arrow type (snapshots compare the type of
        `dbt_updated_at` with `now()`'s; contracts read a query's column types)."""
        return sql_type_name(type_code) if isinstance(type_code, pa.DataType) else str(type_code).upper()

    @classmethod
    def get_response(cls, cursor: Any) -> AdapterResponse:
        rows = getattr(cursor, "rowcount", -1)
        return AdapterResponse(_message="OK", rows_affected=rows if rows is not None and rows >= 0 else None)

    # Each ClearIce statement is its own Iceberg commit: there is no transaction to open.
    def add_begin_query(self):
        pass

    def add_commit_query(self):
        pass


def sql_type_name(t: pa.DataType) -> str:
    """DataFusion's SQL name of an Arrow type."""
    named = [
        (pa.types.is_boolean, "BOOLEAN"),
        (pa.types.is_int8, "TINYINT"),
        (pa.types.is_int16, "SMALLINT"),
        (pa.types.is_int32, "INT"),
        (pa.types.is_int64, "BIGINT"),
        (pa.types.is_uint8, "TINYINT UNSIGNED"),
        (pa.types.is_uint16, "SMALLINT UNSIGNED"),
        (pa.types.is_uint32, "INT UNSIGNED"),
        (pa.types.is_uint64, "BIGINT UNSIGNED"),
        (pa.types.is_float32, "FLOAT"),
        (pa.types.is_float64, "DOUBLE"),
        (pa.types.is_string, "VARCHAR"),
        (pa.types.is_large_string, "VARCHAR"),
        (pa.types.is_binary, "BYTEA"),
        (pa.types.is_large_binary, "BYTEA"),
        (pa.types.is_date32, "DATE"),
        (pa.types.is_date64, "DATE"),
    ]
    for is_type, name in named:
        if is_type(t):
            return name
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz is None else "TIMESTAMP WITH TIME ZONE"
    if getattr(pa.types, "is_string_view", None) and pa.types.is_string_view(t):
        return "VARCHAR"
    return str(t).upper()
