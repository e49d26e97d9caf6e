-- Masked values (the pipeline principal sees ssn as its last 4 digits) are not written back.
{{ config(materialized='table') }}
select id, ssn from {{ source('sales', 'customers') }}
