//! Reading samples out of Prometheus text format.

/// The Prometheus text a `/metrics` listener at `addr` serves.
pub async fn scrape(addr: std::net::SocketAddr) -> String {
    let url = format!("http://{addr}/metrics");
    let resp = super::client().get(url).send().await.unwrap();
    resp.text().await.unwrap()
}

/// The value of the sample `name{labels...}` (the given labels must all
/// match; others may exist).
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (label_text, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let end = r.find('}')?;
                    (&r[..end], &r[end + 1..])
                }
                None if rest.starts_with(' ') => ("", rest),
                None => return None,
            };
            let all = labels
                .iter()
                .all(|(k, v)| label_text.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            all.then(|| value.trim().parse().ok()).flatten()
        })
}

#[test]
fn finds_samples_by_labels() {
    let text = "# HELP x y\nx_total{a=\"1\",b=\"2\"} 3\nx_total{a=\"2\",b=\"2\"} 4\nplain 5\n";
    assert_eq!(sample(text, "x_total", &[("a", "2")]), Some(4.0));
    assert_eq!(
        sample(text, "x_total", &[("b", "2"), ("a", "1")]),
        Some(3.0)
    );
    assert_eq!(sample(text, "plain", &[]), Some(5.0));
    assert_eq!(sample(text, "x", &[]), None);
}
