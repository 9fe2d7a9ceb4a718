-- The example app's own table (deploy/example/shipments.py).
CREATE TABLE IF NOT EXISTS shipments (
    order_id bigint NOT NULL,
    tenant   text   NOT NULL,
    PRIMARY KEY (tenant, order_id)
);
