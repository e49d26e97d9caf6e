"""A DB-API 2.0 module over ADBC Flight SQL for ClearIce.

ADBC's own DB-API connection is wrapped for two reasons:

* ClearIce runs a statement when its result is read (Flight SQL's DoGet). SQLAlchemy never
  reads the result of DDL or a write, which would then only be planned. A statement whose
  result is a write's row count (`count`) or empty is read to its end by `execute`.
* Every statement of ClearIce commits on its own (an Iceberg snapshot per write): `commit`
  and `rollback` have nothing to do, where ADBC would refuse them in autocommit mode.

The catalog and schema of the URL are sent as `catalog` and `schema` gRPC headers on every
call (ClearIce resolves one- and two-part names in them)."""

from typing import Any, Optional

import adbc_driver_flightsql.dbapi as _flightsql
from adbc_driver_manager.dbapi import (  # noqa: F401  (the DB-API names)
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
)

apilevel = "2.0"
threadsafety = 1
paramstyle = "qmark"

_HEADER = "adbc.flight.sql.rpc.call_header."


def connect(
    host: str,
    port: int = 50051,
    username: Optional[str] = None,
    password: Optional[str] = None,
    token: Optional[str] = None,
    catalog: Optional[str] = None,
    schema: Optional[str] = None,
    tls: bool = False,
    tls_root_certs: Optional[str] = None,
    tls_skip_verify: bool = False,
) -> "Connection":
    """Open a connection to `clearice serve` at HOST:PORT as USERNAME (password) or with a
    bearer TOKEN. `tls_root_certs` is a PEM file for a private CA."""
    kwargs = {}
    if token:
        kwargs["adbc.flight.sql.authorization_header"] = f"Bearer {token}"
    elif username:
        kwargs["username"] = username
        kwargs["password"] = password or ""
    else:
        raise InterfaceError("clearice: give a user and password, or token=")
    if tls_root_certs:
        if not tls:
            raise InterfaceError("clearice: tls_root_certs needs tls=true")
        try:
            with open(tls_root_certs, encoding="utf-8") as f:
                kwargs["adbc.flight.sql.client_option.tls_root_certs"] = f.read()
        except OSError as e:
            raise InterfaceError(f"clearice: tls_root_certs {tls_root_certs}: {e.strerror}") from None
    if tls_skip_verify:
        if not tls:
            raise InterfaceError("clearice: tls_skip_verify needs tls=true")
        kwargs["adbc.flight.sql.client_option.tls_skip_verify"] = "true"
    if catalog:
        kwargs[_HEADER + "catalog"] = catalog
    if schema:
        kwargs[_HEADER + "schema"] = schema
    uri = f"{'grpc+tls' if tls else 'grpc'}://{host}:{port}"
    conn = _flightsql.connect(uri, db_kwargs=kwargs, autocommit=True)
    return Connection(conn, catalog, schema)


class Connection:
    """ADBC's connection; its `adbc_*` extensions pass through."""

    def __init__(self, adbc, catalog: Optional[str], schema: Optional[str]):
        self._adbc = adbc
        self.catalog = catalog
        self.schema = schema

    def default_catalog(self) -> str:
        """The URL's catalog, else the server's default for this session."""
        return self.catalog or self._adbc.adbc_current_catalog

    def default_schema(self) -> str:
        """The URL's schema, else the server's default for this session."""
        return self.schema or self._adbc.adbc_current_db_schema

    def cursor(self) -> "Cursor":
        return Cursor(self._adbc.cursor())

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        self._adbc.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adbc, name)


class Cursor:
    """ADBC's cursor; a write's (or DDL's) result is read when it is executed."""

    def __init__(self, adbc):
        self._adbc = adbc
        self._rows: Optional[list] = None
        self._rowcount = -1
        self.arraysize = 1

    def execute(self, operation: str, parameters: Any = None) -> "Cursor":
        self._rows = None
        self._rowcount = -1
        self._adbc.execute(operation, parameters)
        self._finish_write()
        return self

    def executemany(self, operation: str, seq_of_parameters: Any) -> None:
        self._rows = None
        self._rowcount = -1
        self._adbc.executemany(operation, seq_of_parameters)
        self._finish_write()

    def _finish_write(self) -> None:
        names = [d[0] for d in self._adbc.description or []]
        if names and names != ["count"]:
            return
        table = self._adbc.fetch_arrow_table()
        self._rows = [tuple(r.values()) for r in table.to_pylist()]
        if names == ["count"] and table.num_rows == 1:
            self._rowcount = int(table.column(0)[0].as_py() or 0)

    @property
    def description(self):
        return self._adbc.description

    @property
    def rowcount(self) -> int:
        return self._rowcount if self._rows is not None else self._adbc.rowcount

    def fetchone(self):
        if self._rows is not None:
            return self._rows.pop(0) if self._rows else None
        return self._adbc.fetchone()

    def fetchmany(self, size: Optional[int] = None):
        size = self.arraysize if size is None else size
        if self._rows is not None:
            rows, self._rows = self._rows[:size], self._rows[size:]
            return rows
        return self._adbc.fetchmany(size)

    def fetchall(self):
        if self._rows is not None:
            rows, self._rows = self._rows, []
            return rows
        return self._adbc.fetchall()

    def close(self) -> None:
        self._adbc.close()

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        pass

    def __iter__(self):
        return iter(self.fetchone, None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adbc, name)
