"""A DB-API 2.0 module over ADBC Flight SQL for ClearIce.

ADBC's own DB-API connection is wrapped for two reasons:

* ClearIce runs a statement when its result is read (Flight SQL's DoGet). SQLAlchemy never
  reads the result of DDL or a write, which would then only be planned. A statement whose
  result is a write's row count (`count`) or empty is read to its end by `execute`.
* Every statement of ClearIce commits on its own (an Iceberg snapshot per write): `commit`
  and `rollback` have nothing to do, where ADBC would refuse them in autocommit mode.

The catalog and schema of the URL are sent as `catalog` and `schema` gRPC headers on every
call (ClearIce resolves one- and two-part names in them)."""

import os
import stat
import weakref
from typing import Any, Optional

import adbc_driver_flightsql.dbapi as _flightsql
import pyarrow as pa
from adbc_driver_manager import AdbcStatusCode
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
# a CA bundle is small; anything bigger is not one (and /dev/zero never ends)
_MAX_PEM_BYTES = 1 << 20


def _refused(message: str) -> InterfaceError:
    return InterfaceError(f"clearice: {message}", status_code=AdbcStatusCode.INVALID_ARGUMENT)


def _read_pem(path: str) -> str:
    """A PEM file of CA certificates: a regular file of at most 1 MiB."""
    try:
        # non-blocking: a FIFO would otherwise hold the caller until someone writes to it
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_PEM_BYTES:
                raise _refused(f"tls_root_certs {path}: not a PEM file of at most 1 MiB")
            return f.read(_MAX_PEM_BYTES).decode("utf-8", "replace")
    except OSError as e:
        raise _refused(f"tls_root_certs {path}: {e.strerror}") from None


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
    tls_root_certs_pem: Optional[str] = None,
    tls_skip_verify: bool = False,
) -> "Connection":
    """Open a connection to `clearice serve` at HOST:PORT as USERNAME (password) or with a
    bearer TOKEN. `tls_root_certs` is a PEM file of a private CA (`tls_root_certs_pem` its
    text: Superset's "Root certificate")."""
    kwargs = {}
    if token:
        kwargs["adbc.flight.sql.authorization_header"] = f"Bearer {token}"
    elif username:
        kwargs["username"] = username
        kwargs["password"] = password or ""
    else:
        raise _refused("give a user and password, or a token (connect_args)")
    if (tls_root_certs or tls_root_certs_pem or tls_skip_verify) and not tls:
        raise _refused("tls_root_certs and tls_skip_verify need tls=true")
    if tls_root_certs:
        tls_root_certs_pem = _read_pem(tls_root_certs)
    if tls_root_certs_pem:
        kwargs["adbc.flight.sql.client_option.tls_root_certs"] = tls_root_certs_pem
    if tls_skip_verify:
        kwargs["adbc.flight.sql.client_option.tls_skip_verify"] = "true"
    if catalog:
        kwargs[_HEADER + "catalog"] = catalog
    if schema:
        kwargs[_HEADER + "schema"] = schema
    uri = f"{'grpc+tls' if tls else 'grpc'}://{host}:{port}"
    conn = _flightsql.connect(uri, db_kwargs=kwargs, autocommit=True)
    return Connection(conn, catalog, schema)


class _Wrapper:
    """An ADBC object (`_adbc`) whose other methods and attributes pass through; a context
    manager that closes it."""

    _adbc: Any

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adbc, name)


class Connection(_Wrapper):
    """ADBC's connection; its `adbc_*` extensions pass through."""

    def __init__(self, adbc, catalog: Optional[str], schema: Optional[str]):
        self._adbc = adbc
        self.catalog = catalog
        self.schema = schema
        self._session_catalog: Optional[str] = None
        self._session_schema: Optional[str] = None
        # ADBC refuses to close a connection with a statement open: its cursors go first
        self._cursors: "weakref.WeakSet[Cursor]" = weakref.WeakSet()

    def default_catalog(self) -> str:
        """The URL's catalog, else the server's default for this session (asked once)."""
        if self._session_catalog is None:
            self._session_catalog = self.catalog or self._adbc.adbc_current_catalog
        return self._session_catalog

    def default_schema(self) -> str:
        """The URL's schema, else the server's default for this session (asked once)."""
        if self._session_schema is None:
            self._session_schema = self.schema or self._adbc.adbc_current_db_schema
        return self._session_schema

    def cursor(self) -> "Cursor":
        cursor = Cursor(self._adbc.cursor())
        self._cursors.add(cursor)
        return cursor

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        for cursor in list(self._cursors):
            try:
                cursor.close()
            except Error:
                pass  # the connection's close below is what matters
        self._adbc.close()


class Cursor(_Wrapper):
    """ADBC's cursor; a write's (or DDL's) result is read when it is executed."""

    def __init__(self, adbc):
        self._adbc = adbc
        self._rows: Optional[list] = None
        self._rowcount = -1
        self._closed = False
        self.arraysize = 1

    def execute(self, operation: str, parameters: Any = None) -> "Cursor":
        self._rows = None
        self._rowcount = -1
        self._adbc.execute(operation, parameters)
        self._finish_write()
        return self

    def executemany(self, operation: str, seq_of_parameters: Any) -> None:
        # ADBC runs each set of parameters as an update to its end: no result to read
        self._rows = []
        self._adbc.executemany(operation, seq_of_parameters)
        self._rowcount = self._adbc.rowcount

    def _finish_write(self) -> None:
        """Read a write's result (one `count: UInt64`, as ClearIce reports rows written)
        or a result of no columns (DDL): ClearIce runs the statement as it is read."""
        description = self._adbc.description
        if description is None:
            self._rows = []
            self._rowcount = self._adbc.rowcount
            return
        write = len(description) == 1 and description[0][0] == "count" and description[0][1] == pa.uint64()
        if description and not write:
            return
        table = self._adbc.fetch_arrow_table()
        self._rows = [tuple(r.values()) for r in table.to_pylist()]
        if write and table.num_rows == 1:
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
        if not self._closed:
            self._closed = True
            self._adbc.close()

    def setinputsizes(self, sizes: Any) -> None:
        pass

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        pass

    def __iter__(self):
        return iter(self.fetchone, None)
