// The Arrow Flight SQL JDBC driver (the one DBeaver loads) against a real `clearice serve`,
// run by crates/cli/tests/it/flight.rs with the JDK's single-file launcher:
//   java --add-opens=java.base/java.nio=ALL-UNNAMED -cp flight-sql-jdbc-driver.jar JdbcClient.java URL
// Prints one line per check, `name<TAB>value`; the Rust test asserts on them.
import java.sql.*;
import java.util.*;

public class JdbcClient {
    static void out(String name, Object value) {
        System.out.println(name + "\t" + String.valueOf(value).replace('\n', ' ').replace('\t', ' '));
    }

    static String err(Exception e) {
        String state = (e instanceof SQLException) ? ((SQLException) e).getSQLState() : null;
        return "ERROR[" + state + "] " + e.getMessage();
    }

    static List<String> col(ResultSet rs, String name) throws SQLException {
        List<String> v = new ArrayList<>();
        while (rs.next()) v.add(rs.getString(name));
        rs.close();
        return v;
    }

    public static void main(String[] args) throws Exception {
        String base = args[0]; // jdbc:arrow-flight-sql://127.0.0.1:PORT/?useEncryption=false
        Properties p = new Properties();
        p.setProperty("user", "admin");
        p.setProperty("password", "admin");
        p.setProperty("catalog", "lake");
        if (args.length > 1 && args[1].equals("tls")) {
            tls(base);
            return;
        }
        Connection c = DriverManager.getConnection(base, p);
        try {
            DatabaseMetaData md = c.getMetaData();
            out("product", md.getDatabaseProductName() + " " + md.getDatabaseProductVersion());
            out("catalogs", col(md.getCatalogs(), "TABLE_CAT"));
            out("schemas", col(md.getSchemas("lake", null), "TABLE_SCHEM"));
            out("tables", col(md.getTables("lake", "sales", "%", null), "TABLE_NAME"));
            ResultSet cols = md.getColumns("lake", "sales", "customers", "%");
            List<String> cl = new ArrayList<>();
            while (cols.next()) cl.add(cols.getString("COLUMN_NAME") + ":" + cols.getString("TYPE_NAME"));
            out("columns", cl);
            out("primary_keys", col(md.getPrimaryKeys("lake", "sales", "customers"), "COLUMN_NAME"));
            out("type_info", col(md.getTypeInfo(), "TYPE_NAME"));
            out("keywords", md.getSQLKeywords());
            // catalog=lake (SetSessionOptions on connect): schema-qualified names resolve.
            try (Statement s = c.createStatement();
                 ResultSet rs = s.executeQuery("SELECT count(*) AS n FROM sales.customers")) {
                rs.next();
                out("session_catalog_count", rs.getLong(1));
            }
            // Every column type of the demo table through ResultSet getters.
            try (Statement s = c.createStatement();
                 ResultSet rs = s.executeQuery("SELECT * FROM lake.sales.customers WHERE id = 1000001")) {
                ResultSetMetaData m = rs.getMetaData();
                rs.next();
                List<String> vals = new ArrayList<>();
                for (int i = 1; i <= m.getColumnCount(); i++) {
                    try {
                        Object o = rs.getObject(i);
                        vals.add(m.getColumnName(i) + "=" + (o == null ? "null" : o.getClass().getSimpleName() + ":" + o));
                    } catch (Exception e) {
                        vals.add(m.getColumnName(i) + "=" + m.getColumnTypeName(i) + " " + err(e));
                    }
                }
                out("row", vals);
                // Flight SQL column metadata: where each column comes from, its precision.
                for (int i = 1; i <= m.getColumnCount(); i++) {
                    if (m.getColumnName(i).equals("balance")) {
                        out("balance_meta", m.getCatalogName(i) + "." + m.getSchemaName(i) + "." + m.getTableName(i)
                            + " " + m.getColumnTypeName(i) + "(" + m.getPrecision(i) + "," + m.getScale(i) + ")");
                    }
                }
                out("balance_decimal", rs.getBigDecimal("balance"));
                out("birth_date", rs.getDate("birth_date"));
                out("ssn", rs.getString("ssn"));
            }
            try (Statement s = c.createStatement();
                 ResultSet rs = s.executeQuery("SELECT order_date, amount, CAST(NULL AS VARCHAR) AS nothing, "
                     + "TIMESTAMP '2025-01-05 10:00:00' AS ts, "
                     + "arrow_cast(TIMESTAMP '2025-01-05 10:00:00', 'Timestamp(Microsecond, Some(\"UTC\"))') AS tstz "
                     + "FROM lake.sales.orders ORDER BY order_id LIMIT 1")) {
                rs.next();
                out("order_date", rs.getDate(1));
                out("amount", rs.getBigDecimal(2));
                out("null_is_null", rs.getString(3) == null && rs.wasNull());
                out("timestamp", rs.getTimestamp(4));
                out("timestamp_tz", rs.getTimestamp(5) != null);
            }
            // Prepared statement with JDBC ? parameters.
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT id, ssn FROM lake.sales.customers WHERE id = ? OR id = ? ORDER BY id")) {
                ps.setLong(1, 1000002);
                ps.setLong(2, 1000003);
                try (ResultSet rs = ps.executeQuery()) {
                    List<String> r = new ArrayList<>();
                    while (rs.next()) r.add(rs.getLong(1) + "/" + rs.getString(2));
                    out("prepared", r);
                }
            }
            // setMaxRows
            try (Statement s = c.createStatement()) {
                s.setMaxRows(5);
                int n = 0;
                try (ResultSet rs = s.executeQuery("SELECT id FROM lake.sales.customers")) {
                    while (rs.next()) n++;
                }
                out("max_rows", n);
            }
            // Cancel of a long query from another thread.
            try (Statement s = c.createStatement()) {
                Thread t = new Thread(() -> {
                    try { Thread.sleep(1500); s.cancel(); } catch (Exception e) { out("cancel_call", err(e)); }
                });
                long start = System.nanoTime();
                t.start();
                try (ResultSet rs = s.executeQuery(
                        "SELECT count(*) FROM lake.sales.customers a, lake.sales.customers b WHERE a.id + b.id = -1")) {
                    while (rs.next()) { }
                    out("cancel", "finished without cancel");
                } catch (Exception e) {
                    out("cancel", "cancelled after " + ((System.nanoTime() - start) / 1_000_000_000.0) + " s: " + err(e));
                }
                t.join();
            }
        } finally {
            // Driver 17.0/18.3 close the client twice when `catalog` is set and the second
            // CloseSession fails on the shut-down channel (apache/arrow-java#66, #863).
            try {
                c.close();
                out("close", "ok");
            } catch (SQLException e) {
                out("close", err(e));
            }
        }
        // Token as password (DBeaver's `token=` property sends it as a bearer token).
        Properties t = new Properties();
        t.setProperty("token", args.length > 2 ? args[2] : "");
        if (args.length > 2) {
            first(base, t, "SELECT 1", "token");
        }
        // A user whose policy denies a column.
        Properties a = new Properties();
        a.setProperty("user", "analyst");
        a.setProperty("password", "analyst");
        // Not a driver property: sent as a `schema` header on every call.
        a.setProperty("schema", "sales");
        try (Connection ac = DriverManager.getConnection(base, a);
             Statement s = ac.createStatement()) {
            try (ResultSet rs = s.executeQuery("SELECT ssn FROM lake.sales.customers WHERE id = 1000001")) {
                rs.next();
                out("analyst_ssn", rs.getString(1));
            }
            // The server's default catalog and the `schema` header: a one-part name resolves.
            try (ResultSet rs = s.executeQuery("SELECT ssn FROM customers WHERE id = 1000001")) {
                rs.next();
                out("analyst_unqualified", rs.getString(1));
            } catch (SQLException e) {
                out("analyst_unqualified", err(e));
            }
            try (ResultSet rs = s.executeQuery("SELECT card_number FROM lake.sales.orders LIMIT 1")) {
                out("denied", "no error");
            } catch (SQLException e) {
                out("denied", err(e));
            }
            try (ResultSet rs = s.executeQuery("SELECT * FROM '/etc/passwd.csv'")) {
                out("file_by_path", "no error");
            } catch (SQLException e) {
                out("file_by_path", err(e));
            }
        }
        // Wrong password.
        Properties w = new Properties();
        w.setProperty("user", "admin");
        w.setProperty("password", "wrong");
        try (Connection wc = DriverManager.getConnection(base, w)) {
            out("wrong_password", "connected");
        } catch (SQLException e) {
            out("wrong_password", err(e));
        }
        out("done", true);
    }

    /// TLS with the server's CA (`tlsRootCerts`) and a client certificate (mTLS).
    static void tls(String base) throws Exception {
        Properties a = new Properties();
        a.setProperty("user", "analyst");
        a.setProperty("password", "analyst");
        first(base, a, "SELECT ssn FROM lake.sales.customers WHERE id = 1000001", "tls_ssn");
        out("done", true);
    }

    /// Connects with `props`, runs `sql` and prints the first value (or the error) as `name`.
    static void first(String base, Properties props, String sql, String name) {
        try (Connection c = DriverManager.getConnection(base, props);
             Statement s = c.createStatement();
             ResultSet rs = s.executeQuery(sql)) {
            rs.next();
            out(name, rs.getString(1));
        } catch (SQLException e) {
            out(name, err(e));
        }
    }
}
