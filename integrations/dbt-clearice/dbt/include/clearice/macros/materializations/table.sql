{#- A table model. A new table is created from the query. An existing one whose columns are
    the model's is replaced in one INSERT OVERWRITE (one Iceberg commit: a query that fails,
    or that the policy refuses, leaves the table as it was); one whose columns changed is
    dropped and created again after the query was checked (ClearIce cannot rename tables, so
    there is no swap). -#}
{% materialization table, adapter='clearice' %}
  {%- set target_relation = this.incorporate(type='table') -%}
  {%- set existing_relation = load_cached_relation(this) -%}

  {{ run_hooks(pre_hooks) }}
  {% call statement('main') -%}
    {{ clearice__replace_table_sql(existing_relation, target_relation, sql) }}
  {%- endcall %}
  {{ run_hooks(post_hooks) }}
  {% do persist_docs(target_relation, model) %}
  {{ return({'relations': [target_relation]}) }}
{% endmaterialization %}

{% materialization view, adapter='clearice' %}
  {{ exceptions.raise_compiler_error("ClearIce: materialized='view' is not supported (Iceberg views are not supported yet); use 'table' or 'incremental' for " ~ this) }}
{% endmaterialization %}

{#- The statement that makes `target` hold the rows of `sql` (see the table materialization). -#}
{% macro clearice__replace_table_sql(existing, target, sql) -%}
  {%- if existing is none -%}
    {{ get_create_table_as_sql(False, target, sql) }}
  {%- else -%}
    {#- Plans and checks the query (names, the policy's denials) without writing. -#}
    {%- set model_columns = run_query(get_empty_subquery_sql(sql)).column_names | map('lower') | list -%}
    {%- set table_columns = adapter.get_columns_in_relation(existing) | map(attribute='name') | map('lower') | list -%}
    {%- if model_columns == table_columns -%}
      {{ clearice__insert_sql(target, sql, 'insert overwrite') }}
    {%- else -%}
      {{ adapter.drop_relation(existing) }}
      {{ get_create_table_as_sql(False, target, sql) }}
    {%- endif -%}
  {%- endif -%}
{%- endmacro %}
