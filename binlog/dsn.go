package binlog

import (
	"errors"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ParseDSN parses a go-sql-driver DSN. Its errors never quote the DSN: some
// of the driver's messages quote a piece of it ("default addr for network
// 'root:hun' unknown", `invalid dbname "ter2@tcp(…)"`), and with a '/' in
// an unescaped password that piece is part of the password.
func ParseDSN(dsn string) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err == nil {
		return cfg, nil
	}
	msg := err.Error()
	if strings.ContainsAny(msg, "'\"%") {
		return nil, errors.New("invalid DSN: want user:password@tcp(host:port)/[db][?params] " +
			"(URL-escape '/', '@' and '%' in the password)")
	}
	return nil, err
}
