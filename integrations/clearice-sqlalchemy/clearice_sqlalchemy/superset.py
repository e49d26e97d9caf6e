"""Superset engine spec for ClearIce (found through the `superset.db_engine_specs` entry
point). Catalogs are Superset catalogs (one database connection browses all the catalogs
the principal sees), time grains are DataFusion's `date_trunc`/`date_bin`, and result
columns are typed from the Arrow schema (DECIMAL(p, s), TIMESTAMP, ...).

Each Superset database connection is one ClearIce principal: ClearIce applies the policy
(masks, hidden and denied columns, row filters) to what Superset reads through it."""

import json
import threading
from datetime import datetime
from typing import Any, Optional
from urllib import parse

import pyarrow as pa
from sqlalchemy import types
from sqlalchemy.engine.url import URL

from superset.constants import TimeGrain
from superset.db_engine_specs.base import BaseEngineSpec

from clearice_sqlalchemy.types import type_name

_BIN = "date_bin(INTERVAL '{}', {{col}}, TIMESTAMP '1970-01-01 00:00:00')"
# Files on the Superset host and unverified TLS are not for whoever may edit a connection
_FORBIDDEN_ARGS = {"tls_root_certs", "tls_skip_verify"}
# the server's default catalog of a database connection without one in its URL, asked once
_DEFAULT_CATALOGS: dict = {}
_DEFAULT_CATALOGS_LOCK = threading.Lock()


class ClearIceEngineSpec(BaseEngineSpec):
    engine = "clearice"
    engine_name = "ClearIce"
    default_driver = "adbc"
    sqlalchemy_uri_placeholder = "clearice://user:password@host:port/catalog/schema"

    supports_dynamic_schema = True
    supports_catalog = supports_dynamic_catalog = supports_cross_catalog_queries = True
    # ClearIce refuses file uploads into tables the policy does not let the principal write;
    # Superset's upload path (pandas to_sql) is not tested against it.
    supports_file_upload = False
    # Files on the Superset host and unverified TLS are not for whoever may edit a database
    # URL: the CA comes from the connection's "Root certificate" (server_cert) instead.
    disallow_uri_query_params = {"adbc": {"tls_root_certs", "tls_skip_verify"}}

    _time_grain_expressions = {
        None: "{col}",
        TimeGrain.SECOND: "date_trunc('second', {col})",
        TimeGrain.FIVE_SECONDS: _BIN.format("5 seconds"),
        TimeGrain.THIRTY_SECONDS: _BIN.format("30 seconds"),
        TimeGrain.MINUTE: "date_trunc('minute', {col})",
        TimeGrain.FIVE_MINUTES: _BIN.format("5 minutes"),
        TimeGrain.TEN_MINUTES: _BIN.format("10 minutes"),
        TimeGrain.FIFTEEN_MINUTES: _BIN.format("15 minutes"),
        TimeGrain.THIRTY_MINUTES: _BIN.format("30 minutes"),
        TimeGrain.HOUR: "date_trunc('hour', {col})",
        TimeGrain.SIX_HOURS: _BIN.format("6 hours"),
        TimeGrain.DAY: "date_trunc('day', {col})",
        TimeGrain.WEEK: "date_trunc('week', {col})",
        TimeGrain.WEEK_STARTING_MONDAY: "date_trunc('week', {col})",
        TimeGrain.MONTH: "date_trunc('month', {col})",
        TimeGrain.QUARTER: "date_trunc('quarter', {col})",
        TimeGrain.YEAR: "date_trunc('year', {col})",
    }

    @classmethod
    def epoch_to_dttm(cls) -> str:
        return "to_timestamp_seconds({col})"

    @classmethod
    def epoch_ms_to_dttm(cls) -> str:
        return "to_timestamp_millis({col})"

    @classmethod
    def convert_dttm(cls, target_type: str, dttm: datetime, db_extra: Optional[dict] = None) -> Optional[str]:
        sqla_type = cls.get_sqla_column_type(target_type)
        if isinstance(sqla_type, types.Date) and not isinstance(sqla_type, types.DateTime):
            return f"DATE '{dttm.date().isoformat()}'"
        if isinstance(sqla_type, types.DateTime):
            return f"""TIMESTAMP '{dttm.isoformat(sep=" ", timespec="microseconds")}'"""
        return None

    @classmethod
    def get_datatype(cls, type_code: Any) -> Optional[str]:
        # ADBC describes result columns by their Arrow type
        if isinstance(type_code, pa.DataType):
            return type_name(type_code)
        return super().get_datatype(type_code)

    @classmethod
    def get_extra_params(cls, database, source=None) -> dict:
        extra = super().get_extra_params(database, source)
        connect_args = extra.setdefault("engine_params", {}).setdefault("connect_args", {})
        _check_connect_args(connect_args)
        if database.server_cert:
            connect_args["tls_root_certs_pem"] = database.server_cert
        return extra

    @staticmethod
    def update_params_from_encrypted_extra(database, params: dict) -> None:
        """Secure Extra's `connect_args` (a token) are added to the connection's, not put in
        their place (Superset's own update would drop the Root certificate)."""
        if not database.encrypted_extra:
            return
        secret = json.loads(database.encrypted_extra)
        connect_args = {**params.get("connect_args", {}), **secret.pop("connect_args", {})}
        _check_connect_args(connect_args)
        params.update(secret)
        params["connect_args"] = connect_args

    @classmethod
    def get_default_catalog(cls, database) -> Optional[str]:
        if catalog := _path(database.url_object)[0]:
            return catalog
        # Superset asks on every query and permission check: the server is asked once per
        # connection URL (put the catalog in the URL to pin it)
        key = (database.id, database.sqlalchemy_uri)
        with _DEFAULT_CATALOGS_LOCK:
            if key in _DEFAULT_CATALOGS:
                return _DEFAULT_CATALOGS[key]
        with database.get_raw_connection() as conn:
            catalog = conn.default_catalog()
        with _DEFAULT_CATALOGS_LOCK:
            _DEFAULT_CATALOGS[key] = catalog
        return catalog

    @classmethod
    def get_catalog_names(cls, database, inspector) -> set:
        with database.get_sqla_engine() as engine, engine.connect() as conn:
            return set(engine.dialect.get_catalog_names(conn))

    @classmethod
    def adjust_engine_params(
        cls,
        uri: URL,
        connect_args: dict,
        catalog: Optional[str] = None,
        schema: Optional[str] = None,
    ) -> tuple:
        current_catalog, current_schema = _path(uri)
        catalog = catalog or current_catalog
        schema = schema or current_schema
        if catalog:
            path = "/".join(parse.quote(p, safe="") for p in [catalog, schema] if p)
            return uri.set(database=path), connect_args
        if schema:
            # no catalog to put it after in the path: the server's default catalog (in
            # place: Superset keeps its own dict, not the one returned)
            connect_args["schema"] = schema
        return uri, connect_args

    @classmethod
    def get_schema_from_engine_params(cls, sqlalchemy_uri: URL, connect_args: dict) -> Optional[str]:
        return _path(sqlalchemy_uri)[1] or connect_args.get("schema")


def _check_connect_args(connect_args: dict) -> None:
    if forbidden := _FORBIDDEN_ARGS.intersection(connect_args):
        raise ValueError(
            f"ClearIce connection: {', '.join(sorted(forbidden))} cannot be set in Superset; "
            "give the CA as the connection's Root certificate"
        )


def _path(uri: URL) -> tuple:
    parts = [parse.unquote(p) for p in (uri.database or "").split("/") if p]
    return (parts[0] if parts else None, parts[1] if len(parts) > 1 else None)
