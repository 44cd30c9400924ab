-- Golden test script (binlog/golden_test.go): every MySQL type cdcout
-- decodes, with edge values, then inserts, updates and deletes. Run on one
-- connection in database cdcout_golden; statements end with ';' at the end
-- of a line. Every change it makes is streamed and compared byte for byte
-- with types.golden.jsonl.
--
-- No STRICT mode and no NO_ZERO_DATE/NO_ZERO_IN_DATE, so zero dates, the
-- ENUM error value '' and partial dates can be stored.
SET SESSION sql_mode = '';
SET SESSION time_zone = '+00:00';
SET NAMES utf8mb4;

CREATE TABLE ints (
  id INT NOT NULL PRIMARY KEY,
  ti TINYINT, tiu TINYINT UNSIGNED,
  si SMALLINT, siu SMALLINT UNSIGNED,
  mi MEDIUMINT, miu MEDIUMINT UNSIGNED,
  i INT, iu INT UNSIGNED,
  bi BIGINT, biu BIGINT UNSIGNED
);

CREATE TABLE nums (
  id INT NOT NULL PRIMARY KEY,
  d65 DECIMAL(65,30), d10 DECIMAL(10,3), d5 DECIMAL(5,0),
  f FLOAT, dbl DOUBLE,
  b1 BIT(1), b7 BIT(7), b8 BIT(8), b17 BIT(17), b63 BIT(63), b64 BIT(64)
);

CREATE TABLE times (
  id INT NOT NULL PRIMARY KEY,
  d DATE,
  dt0 DATETIME, dt1 DATETIME(1), dt2 DATETIME(2), dt3 DATETIME(3), dt4 DATETIME(4), dt5 DATETIME(5), dt6 DATETIME(6),
  ts0 TIMESTAMP NULL DEFAULT NULL, ts1 TIMESTAMP(1) NULL DEFAULT NULL, ts2 TIMESTAMP(2) NULL DEFAULT NULL,
  ts3 TIMESTAMP(3) NULL DEFAULT NULL, ts4 TIMESTAMP(4) NULL DEFAULT NULL, ts5 TIMESTAMP(5) NULL DEFAULT NULL,
  ts6 TIMESTAMP(6) NULL DEFAULT NULL,
  t0 TIME, t1 TIME(1), t3 TIME(3), t6 TIME(6),
  y YEAR
);

CREATE TABLE texts (
  id INT NOT NULL PRIMARY KEY,
  c_u CHAR(10) CHARACTER SET utf8mb4, v_u VARCHAR(300) CHARACTER SET utf8mb4,
  tt_u TINYTEXT CHARACTER SET utf8mb4, t_u TEXT CHARACTER SET utf8mb4,
  mt_u MEDIUMTEXT CHARACTER SET utf8mb4, lt_u LONGTEXT CHARACTER SET utf8mb4,
  c_l CHAR(10) CHARACTER SET latin1, v_l VARCHAR(300) CHARACTER SET latin1, t_l TEXT CHARACTER SET latin1,
  v_m3 VARCHAR(20) CHARACTER SET utf8mb3
);

CREATE TABLE bins (
  id INT NOT NULL PRIMARY KEY,
  b4 BINARY(4), vb VARBINARY(300),
  tb TINYBLOB, b BLOB, mb MEDIUMBLOB, lb LONGBLOB
);

CREATE TABLE enums (
  id INT NOT NULL PRIMARY KEY,
  e ENUM('small','médium','large') CHARACTER SET utf8mb4,
  e_l ENUM('café','naïve') CHARACTER SET latin1,
  s SET('a','b','c','d') CHARACTER SET utf8mb4
);

CREATE TABLE docs (
  id INT NOT NULL PRIMARY KEY,
  j JSON
);

CREATE TABLE geo (
  id INT NOT NULL PRIMARY KEY,
  g GEOMETRY, p POINT, ls LINESTRING
);

CREATE TABLE composite (
  region VARCHAR(10) CHARACTER SET utf8mb4 NOT NULL,
  n BIGINT UNSIGNED NOT NULL,
  v VARCHAR(20),
  PRIMARY KEY (n, region)
);

CREATE TABLE ukey (
  maybe INT NULL,
  code VARCHAR(10) CHARACTER SET utf8mb4 NOT NULL,
  v INT,
  UNIQUE KEY nullable_first (maybe),
  UNIQUE KEY code_uk (code)
);

CREATE TABLE nokey (
  a INT,
  b VARCHAR(10)
);

-- Integers: minimums, maximums, zero, NULL.
INSERT INTO ints VALUES (1, -128, 0, -32768, 0, -8388608, 0, -2147483648, 0, -9223372036854775808, 0);
INSERT INTO ints VALUES (2, 127, 255, 32767, 65535, 8388607, 16777215, 2147483647, 4294967295, 9223372036854775807, 18446744073709551615);
INSERT INTO ints VALUES (3, 0, 128, 0, 32768, 0, 8388608, 0, 2147483648, 0, 9223372036854775808);
INSERT INTO ints (id) VALUES (4);
UPDATE ints SET biu = 18446744073709551614, bi = -1 WHERE id = 2;
DELETE FROM ints WHERE id = 3;

-- Decimals, floats, bits.
INSERT INTO nums VALUES (1,
  '99999999999999999999999999999999999.999999999999999999999999999999', '1.5', '12345',
  3.40282e38, 1.7976931348623157e308,
  1, 127, 255, 131071, 9223372036854775807, 18446744073709551615);
INSERT INTO nums VALUES (2,
  '-99999999999999999999999999999999999.999999999999999999999999999999', '-0.001', '-99999',
  -1.17549e-38, -2.2250738585072014e-308,
  0, 0, 0, 0, 0, 0);
INSERT INTO nums VALUES (3,
  '0.000000000000000000000000000001', '0', '0',
  0.1, 0.1,
  b'1', b'1010101', b'10000000', b'10000000000000001', b'100000000000000000000000000000000000000000000000000000000000001', b'1000000000000000000000000000000000000000000000000000000000000001');
INSERT INTO nums (id) VALUES (4);
UPDATE nums SET d10 = '1234567.125', f = 1.5, dbl = -0.5 WHERE id = 3;
DELETE FROM nums WHERE id = 2;

-- Temporal types: ordinary, extreme, zero, NULL.
INSERT INTO times VALUES (1, '2024-02-29',
  '2024-02-29 13:14:15', '2024-02-29 13:14:15.1', '2024-02-29 13:14:15.12', '2024-02-29 13:14:15.123',
  '2024-02-29 13:14:15.1234', '2024-02-29 13:14:15.12345', '2024-02-29 13:14:15.123456',
  '2024-02-29 13:14:15', '2024-02-29 13:14:15.1', '2024-02-29 13:14:15.12', '2024-02-29 13:14:15.123',
  '2024-02-29 13:14:15.1234', '2024-02-29 13:14:15.12345', '2024-02-29 13:14:15.123456',
  '13:14:15', '13:14:15.1', '13:14:15.123', '13:14:15.123456', 2024);
INSERT INTO times VALUES (2, '9999-12-31',
  '9999-12-31 23:59:59', '9999-12-31 23:59:59.9', '9999-12-31 23:59:59.99', '9999-12-31 23:59:59.999',
  '9999-12-31 23:59:59.9999', '9999-12-31 23:59:59.99999', '9999-12-31 23:59:59.999999',
  '2038-01-19 03:14:07', '2038-01-19 03:14:07.9', '2038-01-19 03:14:07.99', '2038-01-19 03:14:07.999',
  '2038-01-19 03:14:07.9999', '2038-01-19 03:14:07.99999', '2038-01-19 03:14:07.999999',
  '838:59:59', '838:59:59.9', '838:59:59.999', '838:59:59.000000', 2155);
INSERT INTO times VALUES (3, '1000-01-01',
  '1000-01-01 00:00:00', '1000-01-01 00:00:00.0', '1000-01-01 00:00:00.00', '1000-01-01 00:00:00.000',
  '1000-01-01 00:00:00.0000', '1000-01-01 00:00:00.00000', '1000-01-01 00:00:00.000000',
  '1970-01-01 00:00:01', '1970-01-01 00:00:01.0', '1970-01-01 00:00:00.01', '1970-01-01 00:00:00.001',
  '1970-01-01 00:00:00.0001', '1970-01-01 00:00:00.00001', '1970-01-01 00:00:00.000001',
  '-838:59:59', '-00:00:00.1', '-01:02:03.456', '-00:00:00.000001', 1901);
-- Zero dates (kept distinguishable, never null) and the zero year.
INSERT INTO times VALUES (4, '0000-00-00',
  '0000-00-00 00:00:00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', '0000-00-00 00:00:00',
  '0000-00-00 00:00:00', '0000-00-00 00:00:00', '0000-00-00 00:00:00',
  '0000-00-00 00:00:00', '0000-00-00 00:00:00', '0000-00-00 00:00:00', '0000-00-00 00:00:00',
  '0000-00-00 00:00:00', '0000-00-00 00:00:00', '0000-00-00 00:00:00',
  '00:00:00', '00:00:00', '00:00:00', '00:00:00', 0);
-- Partial zero dates.
INSERT INTO times (id, d, dt0, dt3) VALUES (5, '2024-00-15', '2024-05-00 10:00:00', '0000-01-01 00:00:00.5');
INSERT INTO times (id) VALUES (6);
-- TIMESTAMP is stored in UTC whatever the session zone: 05:30 at +05:30
-- is 00:00 UTC; DATETIME is stored as written.
SET SESSION time_zone = '+05:30';
INSERT INTO times (id, dt0, ts0, ts6) VALUES (7, '2024-01-01 05:30:00', '2024-01-01 05:30:00', '2024-01-01 05:30:00.000001');
SET SESSION time_zone = '+00:00';
UPDATE times SET t6 = '-123:45:06.7', dt6 = '2000-01-01 00:00:00.5', ts3 = '2001-02-03 04:05:06.007', y = 1999 WHERE id = 1;
DELETE FROM times WHERE id = 2;

-- Text: utf8mb4 with emoji, latin1 with non-ASCII (stored as MySQL's
-- cp1252 bytes), control characters and quotes, empty strings, NULL.
INSERT INTO texts VALUES (1, 'héllo 😀', 'emoji 😀🎉 and CJK 你好', 'tiny ✓', 'text "quoted" \\ back\nslash\ttab', 'medium 𝄞', 'long ∑',
  'café', 'naïve € Œ ‰ ÿ', 'Grüße, señor «ok»', 'mb3 ✓');
INSERT INTO texts VALUES (2, '', '', '', '', '', '', '', '', '', '');
INSERT INTO texts VALUES (3, 'trail  ', '  lead', CONCAT('ctl', CHAR(1), CHAR(31), CHAR(127)), '</script><&>', CONCAT('ls', _utf8mb4 0xE280A8, 'ps', _utf8mb4 0xE280A9), 'x',
  'ÿ', CONCAT('raw', CHAR(129 USING latin1), CHAR(141 USING latin1)), 'œ', 'é');
INSERT INTO texts (id) VALUES (4);
UPDATE texts SET v_u = 'updated 🚀', v_l = 'àéîõü' WHERE id = 1;
DELETE FROM texts WHERE id = 2;

-- Binary strings with bytes that are not UTF-8; BINARY(4) pads with 0x00.
INSERT INTO bins VALUES (1, X'FF00FE', X'FFFEFD00C328', X'80', X'C3', X'E29C', X'F0288CBC');
INSERT INTO bins VALUES (2, X'01000000', X'', X'', X'', X'', X'');
INSERT INTO bins VALUES (3, X'00', X'00', X'00000000', X'0A0D09', X'22', X'5C');
INSERT INTO bins (id) VALUES (4);
UPDATE bins SET vb = X'DEADBEEF', b4 = X'DEADBEEF' WHERE id = 1;
DELETE FROM bins WHERE id = 3;

-- ENUM (incl. the '' error value, index 0) and SET (incl. the empty set).
INSERT INTO enums VALUES (1, 'médium', 'café', 'a,c,d');
INSERT INTO enums VALUES (2, 'large', 'naïve', '');
INSERT INTO enums VALUES (3, 'not a member', 'naïve', 'd,b');
INSERT INTO enums (id) VALUES (4);
UPDATE enums SET e = 'small', s = 'b' WHERE id = 1;
DELETE FROM enums WHERE id = 2;

-- JSON: nested, unsorted keys, unicode, big and precise numbers, scalars.
INSERT INTO docs VALUES (1, '{"z": {"y": [3, 2, 1], "x": {"b": true, "a": null}}, "a": "first", "m": []}');
INSERT INTO docs VALUES (2, '{"unicode": "é 😀 \\u00e9 \\ud83d\\ude00", "esc": "line\\nbreak \\"q\\" \\\\ /", "html": "<&>"}');
INSERT INTO docs VALUES (3, '{"big": 18446744073709551616, "neg": -9223372036854775809, "dec": 1.0000000000000000000001, "exp": 1.5E+300, "int": 42}');
INSERT INTO docs VALUES (4, '[1, "two", {"3": 3, "10": 10, "2": 2}, [], {}, null, false]');
INSERT INTO docs VALUES (5, '"just a string"');
INSERT INTO docs VALUES (6, 'null');
INSERT INTO docs VALUES (7, NULL);
-- Typed scalars inside documents (MySQL stores DATE, TIME, DATETIME and
-- DECIMAL as opaque values, doubles as doubles): each must read as the
-- server prints it. A document over 64 KiB uses MySQL's large format.
INSERT INTO docs VALUES (8, JSON_OBJECT('date', CAST('2024-02-29' AS DATE), 'dt', CAST('2024-02-29 13:14:15.5' AS DATETIME(6)), 'time', CAST('-838:59:59' AS TIME), 't3', CAST('10:11:12.123' AS TIME(3)), 'dec', CAST(12.345 AS DECIMAL(10,3)), 'dec0', CAST(-7 AS DECIMAL(5,0)), 'small', CAST(0.001 AS DECIMAL(6,4)), 'wide', CAST(-123456789012345678.123456789012 AS DECIMAL(30,12))));
INSERT INTO docs VALUES (9, JSON_ARRAY(CAST(0.1 AS DOUBLE), CAST(1e-7 AS DOUBLE), CAST(3 AS DOUBLE), CAST(1e15 AS DOUBLE), CAST(123456789012345678 AS DOUBLE), CAST(1e-15 AS DOUBLE), CAST(1e-16 AS DOUBLE), CAST(-2.2250738585072014e-308 AS DOUBLE), CAST(1.7976931348623157e308 AS DOUBLE), 18446744073709551615, -9223372036854775808, 'é 😀', JSON_OBJECT('nested', JSON_ARRAY(CAST(1.50 AS DECIMAL(4,2)), TRUE, NULL))));
INSERT INTO docs VALUES (10, JSON_OBJECT('big', REPEAT('ab', 33000), 'n', 70000, 'arr', JSON_ARRAY(1, -1, 65536, -70000, 'x')));
UPDATE docs SET j = '{"z": 1, "a": {"d": 4, "c": 3}}' WHERE id = 1;
DELETE FROM docs WHERE id = 5;

-- Spatial: MySQL's internal format (4-byte SRID + WKB), as base64.
INSERT INTO geo VALUES (1, ST_GeomFromText('POLYGON((0 0, 10 0, 10 10, 0 10, 0 0))'), ST_GeomFromText('POINT(1.5 -2.25)'), ST_GeomFromText('LINESTRING(0 0, 1 1, 2 0)'));
INSERT INTO geo VALUES (2, ST_GeomFromText('POINT(3 4)', 4326), ST_GeomFromText('POINT(0 0)', 4326), NULL);
INSERT INTO geo (id) VALUES (3);
UPDATE geo SET p = ST_GeomFromText('POINT(-1 -1)') WHERE id = 1;
DELETE FROM geo WHERE id = 2;

-- Composite primary key; an update that changes part of the key.
INSERT INTO composite VALUES ('eu', 1, 'one'), ('us', 1, 'uno'), ('eu', 18446744073709551615, 'max');
UPDATE composite SET v = 'ONE' WHERE region = 'eu' AND n = 1;
UPDATE composite SET region = 'ap' WHERE region = 'us' AND n = 1;
DELETE FROM composite WHERE n = 18446744073709551615;

-- Only a NOT NULL unique key (the nullable one comes first and is skipped).
INSERT INTO ukey VALUES (NULL, 'A', 1), (7, 'B', 2);
UPDATE ukey SET v = 10 WHERE code = 'A';
UPDATE ukey SET code = 'C' WHERE code = 'B';
DELETE FROM ukey WHERE code = 'A';

-- No key at all: key null, duplicates allowed.
INSERT INTO nokey VALUES (1, 'dup'), (1, 'dup'), (NULL, NULL);
UPDATE nokey SET b = 'changed' WHERE a IS NULL;
DELETE FROM nokey WHERE a = 1 LIMIT 1;

-- One transaction with several tables: row ordinals run across them.
BEGIN;
INSERT INTO ints (id, ti) VALUES (10, 1);
INSERT INTO nokey VALUES (2, 'tx');
UPDATE ints SET ti = 2 WHERE id = 10;
COMMIT;
