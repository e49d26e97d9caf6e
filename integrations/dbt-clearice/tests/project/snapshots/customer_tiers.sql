-- A type-2 history of each customer's tier: `--vars {run: N}` sets every tier to N, so the
-- second `dbt snapshot` closes the first versions (dbt_valid_to) and opens new ones.
{% snapshot customer_tiers %}
{{ config(schema='snap', unique_key='id', strategy='check', check_cols=['tier']) }}
select id, country, {{ var('run', 1) }} as tier
from {{ ref('stg_customers') }}
where id < 1000010
{% endsnapshot %}
