module github.com/spotagent/spotagent

go 1.24
