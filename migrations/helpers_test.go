package migrations_test

import "database/sql"

func openDB(u string) (*sql.DB, error) { return sql.Open("postgres", u) }
