-- Appended on every run.
{{ config(materialized='incremental', incremental_strategy='append') }}
select count(*) as orders, {{ var('run', 1) }} as run from {{ source('sales', 'orders') }}
