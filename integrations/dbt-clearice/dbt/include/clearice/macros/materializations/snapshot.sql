{#- Snapshots use dbt's own materialization (type-2 history with dbt_valid_from/_to). Two
    differences: the MERGE names the source's columns in its VALUES (ClearIce refuses a name
    that is a column of both the target and the source rather than guess), and the staging
    table (a real table next to the snapshot: Iceberg catalogs have no temporary tables) is
    dropped after the merge, and before it is built again if a failed run left it. -#}
{% macro clearice__snapshot_merge_sql(target, source, insert_cols) -%}
    {%- set columns = config.get("snapshot_table_column_names") or get_snapshot_table_column_names() -%}
    merge into {{ target.render() }} as DBT_INTERNAL_DEST
    using {{ source }} as DBT_INTERNAL_SOURCE
    on DBT_INTERNAL_SOURCE.{{ columns.dbt_scd_id }} = DBT_INTERNAL_DEST.{{ columns.dbt_scd_id }}
    when matched
     {% if config.get("dbt_valid_to_current") %}
       {% set source_unique_key = ("DBT_INTERNAL_DEST." ~ columns.dbt_valid_to) | trim %}
       {% set target_unique_key = config.get('dbt_valid_to_current') | trim %}
       and ({{ equals(source_unique_key, target_unique_key) }} or {{ source_unique_key }} is null)
     {% else %}
       and DBT_INTERNAL_DEST.{{ columns.dbt_valid_to }} is null
     {% endif %}
     and DBT_INTERNAL_SOURCE.dbt_change_type in ('update', 'delete')
        then update
        set {{ columns.dbt_valid_to }} = DBT_INTERNAL_SOURCE.{{ columns.dbt_valid_to }}
    when not matched
     and DBT_INTERNAL_SOURCE.dbt_change_type = 'insert'
        then insert ({{ insert_cols | join(', ') }})
        values ({% for c in insert_cols %}DBT_INTERNAL_SOURCE.{{ c }}{% if not loop.last %}, {% endif %}{% endfor %})
{%- endmacro %}

{% macro clearice__post_snapshot(staging_relation) %}
  {% do adapter.drop_relation(staging_relation) %}
{% endmacro %}
