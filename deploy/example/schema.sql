-- The example app's own table: deploy/example/shipments.py, the README's quickstart
-- (tests/test_readme.py keeps the two the same). `idempotent-workers migrate`
-- makes only the framework's tables.
CREATE TABLE IF NOT EXISTS shipments (
    order_id bigint NOT NULL,
    tenant   text   NOT NULL,
    PRIMARY KEY (tenant, order_id)
);
