{#- Incremental models into Iceberg tables: `append` (INSERT), `merge` (MERGE INTO on
    `unique_key`) and `insert_overwrite` (the table's rows replaced: the tables dbt creates
    are not partitioned). Each is one ClearIce statement, so one Iceberg commit; columns go
    by name. -#}
{% materialization incremental, adapter='clearice' %}
  {%- set target_relation = this.incorporate(type='table') -%}
  {%- set existing_relation = load_cached_relation(this) -%}
  {%- set strategy = config.get('incremental_strategy') or 'append' -%}
  {%- set unique_key = config.get('unique_key') -%}
  {%- if strategy not in adapter.valid_incremental_strategies() -%}
    {{ exceptions.raise_compiler_error("ClearIce: incremental_strategy '" ~ strategy ~ "' is not supported (append, merge, insert_overwrite)") }}
  {%- endif -%}

  {{ run_hooks(pre_hooks) }}
  {% if existing_relation is none %}
    {% set build_sql = get_create_table_as_sql(False, target_relation, sql) %}
  {% elif should_full_refresh() %}
    {% set build_sql = clearice__replace_table_sql(existing_relation, target_relation, sql) %}
  {% elif strategy == 'append' %}
    {% set build_sql = clearice__insert_sql(target_relation, sql, 'insert into') %}
  {% elif strategy == 'insert_overwrite' %}
    {% set build_sql = clearice__insert_sql(target_relation, sql, 'insert overwrite') %}
  {% else %}
    {% if not unique_key %}
      {{ exceptions.raise_compiler_error("ClearIce: incremental_strategy 'merge' needs a unique_key (" ~ this ~ ")") }}
    {% endif %}
    {% set build_sql = clearice__merge_sql(target_relation, sql, unique_key) %}
  {% endif %}
  {% call statement('main') -%}
    {{ build_sql }}
  {%- endcall %}
  {{ run_hooks(post_hooks) }}
  {% do persist_docs(target_relation, model) %}
  {{ return({'relations': [target_relation]}) }}
{% endmaterialization %}

{% macro clearice__insert_sql(target, sql, verb) -%}
  {%- set columns = adapter.get_columns_in_relation(target) -%}
  {{ verb }} {{ target }} ({%- for c in columns -%}{{ adapter.quote(c.name) }}{%- if not loop.last %}, {% endif -%}{%- endfor -%})
  select {% for c in columns -%}{{ adapter.quote(c.name) }}{%- if not loop.last %}, {% endif -%}{%- endfor %}
  from ({{ sql }}) as dbt_source
{%- endmacro %}

{% macro clearice__merge_sql(target, sql, unique_key) -%}
  {%- set keys = [unique_key] if unique_key is string else unique_key -%}
  {%- set columns = adapter.get_columns_in_relation(target) -%}
  merge into {{ target }} as dbt_target
  using ({{ sql }}) as dbt_source
  on {% for k in keys -%}dbt_target.{{ adapter.quote(k) }} = dbt_source.{{ adapter.quote(k) }}{%- if not loop.last %} and {% endif -%}{%- endfor %}
  when matched then update set
    {% for c in columns -%}{{ adapter.quote(c.name) }} = dbt_source.{{ adapter.quote(c.name) }}{%- if not loop.last %}, {% endif -%}{%- endfor %}
  when not matched then insert ({%- for c in columns -%}{{ adapter.quote(c.name) }}{%- if not loop.last %}, {% endif -%}{%- endfor -%})
    values ({%- for c in columns -%}dbt_source.{{ adapter.quote(c.name) }}{%- if not loop.last %}, {% endif -%}{%- endfor -%})
{%- endmacro %}
