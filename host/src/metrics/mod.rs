//! Prometheus metrics (docs/metrics.md): one registry per process, the daemon's or the
//! webhook's families registered into it, served as plain HTTP `GET /metrics` at
//! `--metrics-address` by the process's own runtime with the webhook's connection and time
//! limits. Recording a value is an atomic update (or a short lock of one family): the work
//! loop never waits for a scrape.
//!
//! Files by what they own:
//! - `daemon`: the daemon's families (reconciles, readiness, backoff, repairs, pulls);
//! - `webhook`: the webhook's families (decisions, durations, warnings, refused connections);
//! - `serve`: the listener and the exposition (Prometheus text 0.0.4, OpenMetrics when asked).

pub(crate) mod daemon;
pub(crate) mod serve;
pub(crate) mod webhook;

pub(crate) use prometheus_client::registry::Registry;

/// Seconds since the Unix epoch now, for the `_timestamp_seconds` gauges.
pub(crate) fn now_seconds() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// A label value cut to at most 256 bytes (on a character boundary), so no label grows
/// with its input.
pub(crate) fn bounded(s: &str) -> String {
    let mut end = s.len().min(256);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Every family of both registries: name (as exposed) -> (type, HELP).
    fn families() -> BTreeMap<String, (String, String)> {
        let mut r = Registry::default();
        let d = daemon::DaemonMetrics::register(&mut r);
        d.installed(&daemon::InstalledInfo {
            version: "v1".into(),
            image: "quay.io/x/y:v1".into(),
            digest: "sha256:0".into(),
            provider: "se".into(),
            runtime_class: String::new(),
        });
        d.kata_release(Some("3.25.0-6.el9"));
        webhook::WebhookMetrics::register(&mut r);
        let (text, _) = serve::encode(&r, false).expect("encode");
        let mut out = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP name text");
                let help = help.strip_suffix('.').unwrap_or(help);
                out.entry(name.to_string()).or_insert((String::new(), String::new())).1 = help.to_string();
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, ty) = rest.split_once(' ').expect("TYPE name type");
                out.entry(name.to_string()).or_insert((String::new(), String::new())).0 = ty.to_string();
            }
        }
        out
    }

    /// docs/metrics.md lists exactly the registered families, with their type and HELP.
    #[test]
    fn the_documented_metrics_are_the_registered_ones() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).expect("docs");
        let table = doc
            .split("<!-- metrics:begin -->")
            .nth(1)
            .and_then(|t| t.split("<!-- metrics:end -->").next())
            .expect("docs/metrics.md has the metrics table between its markers");
        let mut documented = BTreeMap::new();
        for row in table.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            assert_eq!(cells.len(), 3, "{row}");
            documented.insert(cells[0].trim_matches('`').to_string(), (cells[1].to_string(), cells[2].to_string()));
        }
        assert_eq!(documented, families());
    }

    /// No label value grows past 256 bytes, and a cut never splits a character.
    #[test]
    fn label_values_are_bounded() {
        assert_eq!(bounded(&"a".repeat(1000)).len(), 256);
        assert_eq!(bounded(&"é".repeat(200)).len(), 256);
        assert_eq!(bounded("short"), "short");
    }
}
