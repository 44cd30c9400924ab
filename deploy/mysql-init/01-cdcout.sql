-- Least-privilege account for cdcout: read the binlog (REPLICATION SLAVE,
-- REPLICATION CLIENT), read table schemas and backfill rows (SELECT), and own
-- its state database (cdcout). Nothing else.
CREATE USER IF NOT EXISTS 'cdcout'@'%' IDENTIFIED BY 'cdcout-demo-password';
GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO 'cdcout'@'%';
GRANT SELECT ON *.* TO 'cdcout'@'%';
CREATE DATABASE IF NOT EXISTS cdcout;
GRANT ALL PRIVILEGES ON cdcout.* TO 'cdcout'@'%';

CREATE DATABASE IF NOT EXISTS shop;
CREATE TABLE IF NOT EXISTS shop.orders (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer VARCHAR(100) NOT NULL,
  amount DECIMAL(12,2) NOT NULL,
  status ENUM('new','paid','shipped','cancelled') NOT NULL DEFAULT 'new',
  updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
);
