//! The example `fenced_sql` run as a test: a holder that stalled past its lease writes to a SQL
//! database (SQLite, through the `sqlite3` command) with its stale fencing token, after a later
//! holder wrote with a larger one, and the database's fence refuses it. Skipped, saying so, where
//! `sqlite3` is not installed.

#[path = "../examples/fenced_sql.rs"]
mod fenced_sql;

#[test]
fn a_stale_holders_sql_write_is_refused_by_the_fence() {
    if std::process::Command::new("sqlite3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: sqlite3 is not installed (apt-get install sqlite3)");
        return;
    }
    fenced_sql::main().expect("the fence held");
}
