{#- ClearIce speaks DataFusion's SQL: catalogs are dbt databases, Iceberg namespaces are
    schemas, and each catalog has DataFusion's lower-case information_schema. -#}

{% macro clearice__get_binding_char() %}?{% endmacro %}

{% macro clearice__list_schemas(database) -%}
  {% set sql %}
    select schema_name from {{ database }}.information_schema.schemata
    where catalog_name = '{{ database }}' and schema_name <> 'information_schema'
  {% endset %}
  {{ return(run_query(sql)) }}
{%- endmacro %}

{% macro clearice__check_schema_exists(information_schema, schema) -%}
  {% set sql %}
    select count(*) from {{ information_schema.database }}.information_schema.schemata
    where catalog_name = '{{ information_schema.database }}' and schema_name = '{{ schema }}'
  {% endset %}
  {{ return(run_query(sql)) }}
{%- endmacro %}

{% macro clearice__create_schema(relation) -%}
  {%- call statement('create_schema') -%}
    create schema if not exists {{ relation.database }}.{{ relation.schema }}
  {%- endcall -%}
{%- endmacro %}

{% macro clearice__drop_schema(relation) -%}
  {%- call statement('drop_schema') -%}
    drop schema if exists {{ relation.database }}.{{ relation.schema }} cascade
  {%- endcall -%}
{%- endmacro %}

{% macro clearice__list_relations_without_caching(schema_relation) %}
  {% call statement('list_relations_without_caching', fetch_result=True) -%}
    select table_catalog as "database", table_name as "name", table_schema as "schema",
           case when table_type = 'VIEW' then 'view' else 'table' end as "type"
    from {{ schema_relation.database }}.information_schema.tables
    where table_catalog = '{{ schema_relation.database }}'
      and table_schema = '{{ schema_relation.schema }}'
  {%- endcall %}
  {{ return(load_result('list_relations_without_caching').table) }}
{% endmacro %}

{% macro clearice__get_columns_in_relation(relation) -%}
  {% call statement('get_columns_in_relation', fetch_result=True) %}
    select column_name, data_type, character_maximum_length, numeric_precision, numeric_scale
    from {{ relation.database }}.information_schema.columns
    where table_catalog = '{{ relation.database }}'
      and table_schema = '{{ relation.schema }}'
      and table_name = '{{ relation.identifier }}'
    order by ordinal_position
  {% endcall %}
  {{ return(sql_convert_columns_in_relation(load_result('get_columns_in_relation').table)) }}
{%- endmacro %}

{#- A "temporary" table (a snapshot's staging table, `<name>__dbt_tmp`) is a real one: one a
    failed run left is dropped first. Nothing else is dropped, whatever a macro asks. -#}
{% macro clearice__create_table_as(temporary, relation, sql) -%}
  {%- if temporary and relation.identifier.endswith('__dbt_tmp') %}{% do run_query("drop table if exists " ~ relation) %}{% endif -%}
  create table {{ relation }} as
  {{ sql }}
{%- endmacro %}

{% macro clearice__create_view_as(relation, sql) -%}
  {{ exceptions.raise_compiler_error("ClearIce: views in Iceberg catalogs are not supported yet; materialize " ~ relation ~ " as 'table' or 'incremental'") }}
{%- endmacro %}

{% macro clearice__drop_relation(relation) -%}
  {% call statement('drop_relation', auto_begin=False) -%}
    drop table if exists {{ relation }}
  {%- endcall %}
{%- endmacro %}

{% macro clearice__truncate_relation(relation) -%}
  {% call statement('truncate_relation') -%}
    delete from {{ relation }}
  {%- endcall %}
{%- endmacro %}

{% macro clearice__rename_relation(from_relation, to_relation) -%}
  {{ exceptions.raise_compiler_error("ClearIce: tables cannot be renamed (ALTER TABLE ... RENAME TO is not supported): " ~ from_relation) }}
{%- endmacro %}

{% macro clearice__current_timestamp() -%}
  now()
{%- endmacro %}

{#- dbt docs generate: tables and columns as the principal sees them (hidden columns are not listed to it). -#}
{% macro clearice__get_catalog(information_schema, schemas) -%}
  {% set db = information_schema.database %}
  {% call statement('catalog', fetch_result=True) -%}
    select c.table_catalog as table_database,
           c.table_schema as table_schema,
           c.table_name as table_name,
           case when t.table_type = 'VIEW' then 'VIEW' else 'BASE TABLE' end as table_type,
           cast(null as varchar) as table_comment,
           cast(null as varchar) as table_owner,
           c.column_name as column_name,
           c.ordinal_position as column_index,
           c.data_type as column_type,
           cast(null as varchar) as column_comment
    from {{ db }}.information_schema.columns c
    join {{ db }}.information_schema.tables t
      on c.table_catalog = t.table_catalog and c.table_schema = t.table_schema and c.table_name = t.table_name
    where c.table_catalog = '{{ db }}'
      and c.table_schema in ({%- for schema in schemas -%}'{{ schema }}'{%- if not loop.last %}, {% endif -%}{%- endfor -%})
    order by c.table_schema, c.table_name, c.ordinal_position
  {%- endcall %}
  {{ return(load_result('catalog').table) }}
{%- endmacro %}
