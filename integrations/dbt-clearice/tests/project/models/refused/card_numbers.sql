-- The pipeline principal may not read card numbers: this model is refused.
{{ config(materialized='table') }}
select order_id, card_number from {{ source('sales', 'orders') }}
