"""The `clearice://` SQLAlchemy dialect.

    clearice://USER:PASSWORD@HOST:PORT[/CATALOG[/SCHEMA]][?tls=true&tls_root_certs=ca.pem]

The catalog and schema are where one- and two-part names resolve (sent as headers on every
call); without them the server's defaults apply. Reflection reads Flight SQL's metadata
calls (GetCatalogs, GetDbSchemas, GetTables with schemas), so it lists what the principal
may see: hidden columns are not listed."""

from typing import Any, Optional
from urllib import parse

from sqlalchemy import exc
from sqlalchemy.engine import default, reflection
from sqlalchemy.sql import compiler

from clearice_sqlalchemy import dbapi as _dbapi
from clearice_sqlalchemy.types import sql_type

_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
_QUERY_KEYS = {"tls", "tls_root_certs", "tls_skip_verify"}


class ClearIceCompiler(compiler.SQLCompiler):
    """DataFusion's SQL; LIMIT and OFFSET as literals (they take no placeholders)."""

    def limit_clause(self, select, **kw):
        kw = {**kw, "literal_binds": True}
        text = ""
        if select._limit_clause is not None:
            text += "\n LIMIT " + self.process(select._limit_clause, **kw)
        if select._offset_clause is not None:
            text += "\n OFFSET " + self.process(select._offset_clause, **kw)
        return text


class ClearIceTypeCompiler(compiler.GenericTypeCompiler):
    """DataFusion's type names."""

    def visit_FLOAT(self, type_, **kw):
        return "DOUBLE"

    def visit_BLOB(self, type_, **kw):
        return "BYTEA"

    def visit_VARBINARY(self, type_, **kw):
        return "BYTEA"

    def visit_large_binary(self, type_, **kw):
        return "BYTEA"


class ClearIceDialect(default.DefaultDialect):
    name = "clearice"
    driver = "adbc"
    statement_compiler = ClearIceCompiler
    type_compiler = ClearIceTypeCompiler
    supports_statement_cache = True
    supports_native_decimal = True
    supports_native_boolean = True
    supports_alter = False
    supports_sequences = False
    supports_default_values = False
    supports_empty_insert = False
    supports_multivalues_insert = True
    supports_comments = False
    postfetch_lastrowid = False
    default_paramstyle = "qmark"
    # no `WITH ... FOR UPDATE`, no savepoints, no two-phase commit
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False

    @classmethod
    def dbapi(cls):  # SQLAlchemy 1.4
        return _dbapi

    @classmethod
    def import_dbapi(cls):  # SQLAlchemy 2
        return _dbapi

    def create_connect_args(self, url):
        if "token" in url.query:
            raise exc.ArgumentError(
                "clearice URL: a token in the URL is kept and shown in clear text; pass it as "
                "connect_args={'token': ...} (Superset: Secure Extra)"
            )
        unknown = set(url.query) - _QUERY_KEYS
        if unknown:
            raise exc.ArgumentError(
                f"clearice URL: unknown parameter(s) {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(_QUERY_KEYS))})"
            )
        path = [parse.unquote(p) for p in (url.database or "").split("/") if p]
        if len(path) > 2:
            raise exc.ArgumentError(f"clearice URL: the path is /CATALOG[/SCHEMA], not /{url.database}")
        kwargs = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 50051,
            "username": url.username,
            "password": url.password,
            "catalog": path[0] if path else None,
            "schema": path[1] if len(path) > 1 else None,
            "tls": _flag(url.query, "tls"),
            "tls_root_certs": url.query.get("tls_root_certs"),
            "tls_skip_verify": _flag(url.query, "tls_skip_verify"),
        }
        return [], kwargs

    def do_rollback(self, dbapi_connection):
        pass

    def do_commit(self, dbapi_connection):
        pass

    def do_ping(self, dbapi_connection):
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT 1")
            cursor.fetchall()
        finally:
            cursor.close()
        return True

    def _get_default_schema_name(self, connection):
        return _raw(connection).default_schema()

    def default_catalog(self, connection) -> str:
        """The catalog names without one resolve in."""
        return _raw(connection).default_catalog()

    def get_catalog_names(self, connection) -> list:
        """The catalogs the principal sees (GetCatalogs)."""
        rows = _objects(connection, "catalogs")
        return sorted(r["catalog_name"] for r in rows)

    @reflection.cache
    def get_schema_names(self, connection, **kw):
        catalog = self.default_catalog(connection)
        names = set()
        for r in _objects(connection, "db_schemas", catalog_filter=catalog):
            if r["catalog_name"] == catalog:
                names.update(s["db_schema_name"] for s in r["catalog_db_schemas"] or [])
        return sorted(names)

    def _tables(self, connection, schema: Optional[str], kinds: tuple, name: Optional[str] = None) -> list:
        """Names of the schema's tables of these kinds (one GetTables call); `name`: only
        that one (Flight SQL's filters are LIKE patterns: matched exactly here)."""
        catalog = self.default_catalog(connection)
        schema = schema or self.default_schema_name
        names = []
        for r in _objects(
            connection, "tables", catalog_filter=catalog, db_schema_filter=schema,
            table_name_filter=name, table_types_filter=list(kinds),
        ):
            if r["catalog_name"] != catalog:
                continue
            for s in r["catalog_db_schemas"] or []:
                if s["db_schema_name"] == schema:
                    names += [
                        t["table_name"] for t in s["db_schema_tables"] or []
                        if t["table_type"] in kinds and (name is None or t["table_name"] == name)
                    ]
        return sorted(names)

    @reflection.cache
    def get_table_names(self, connection, schema=None, **kw):
        return self._tables(connection, schema, ("TABLE",))

    @reflection.cache
    def get_view_names(self, connection, schema=None, **kw):
        return self._tables(connection, schema, ("VIEW",))

    def has_table(self, connection, table_name, schema=None, **kw):
        return bool(self._tables(connection, schema, ("TABLE", "VIEW"), table_name))

    @reflection.cache
    def get_columns(self, connection, table_name, schema=None, **kw):
        raw = _raw(connection)
        schema = schema or self.default_schema_name
        if not self.has_table(connection, table_name, schema):
            raise exc.NoSuchTableError(f"{raw.default_catalog()}.{schema}.{table_name}")
        arrow = raw.adbc_get_table_schema(table_name, catalog_filter=raw.default_catalog(), db_schema_filter=schema)
        return [
            {"name": f.name, "type": sql_type(f.type), "nullable": f.nullable, "default": None, "autoincrement": False}
            for f in arrow
        ]

    def get_pk_constraint(self, connection, table_name, schema=None, **kw):
        return {"constrained_columns": [], "name": None}

    def get_foreign_keys(self, connection, table_name, schema=None, **kw):
        return []

    def get_indexes(self, connection, table_name, schema=None, **kw):
        return []

    def get_unique_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_check_constraints(self, connection, table_name, schema=None, **kw):
        return []

    def get_table_comment(self, connection, table_name, schema=None, **kw):
        return {"text": None}

    def get_sequence_names(self, connection, schema=None, **kw):
        return []

    def get_temp_table_names(self, connection, schema=None, **kw):
        return []

    def get_temp_view_names(self, connection, schema=None, **kw):
        return []

    def _check_unicode_returns(self, connection, additional_tests=None):
        return True

    def _check_unicode_description(self, connection):
        return True


def _flag(query, key: str) -> bool:
    value = query.get(key)
    if value is None:
        return False
    try:
        return _BOOL[str(value).lower()]
    except KeyError:
        raise exc.ArgumentError(f"clearice URL: {key}={value} is not true or false") from None


def _raw(connection) -> "_dbapi.Connection":
    """The DB-API connection under a SQLAlchemy connection (1.4 and 2)."""
    conn = connection.connection
    while not isinstance(conn, _dbapi.Connection):
        # a pool's connection proxy (or, in SQLAlchemy 1.4, the connection itself at
        # first connect)
        conn = getattr(conn, "dbapi_connection", None) or conn.connection
    return conn


def _objects(connection, depth: str, **filters: Any) -> list:
    return _raw(connection).adbc_get_objects(depth=depth, **filters).read_all().to_pylist()

