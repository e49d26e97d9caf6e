-- Replaced on every run (one INSERT OVERWRITE).
{{ config(materialized='incremental', incremental_strategy='insert_overwrite') }}
select count(*) as orders, {{ var('run', 1) }} as run from {{ source('sales', 'orders') }}
