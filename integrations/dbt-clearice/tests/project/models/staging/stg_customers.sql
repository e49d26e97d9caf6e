-- Only what the pipeline principal reads in plaintext is copied: ClearIce refuses to write
-- masked values (its ssn and e-mail are masked) into a table. `--vars {break: true}` makes
-- the query fail (the test checks the table survives it).
select id, country, balance{% if var('break', false) %}, no_such_column{% endif %}
from {{ source('sales', 'customers') }}
