use std::time::Instant;

use super::*;

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, i], 8000))
}

fn card(id: &str, parent: Option<&str>) -> Card {
    Card {
        id: id.into(),
        parent: parent.map(Into::into),
    }
}

/// Two learned pools (labelled 0 and 1); `base` is configured.
fn catalog() -> Catalog<u8> {
    Catalog::new(
        vec![Arc::new(0), Arc::new(1)],
        HashSet::from(["base".into()]),
    )
}

fn backends(c: &Catalog<u8>, name: &str) -> Option<(u8, Vec<SocketAddr>)> {
    c.served(name).map(|s| (*s.pool, s.backends.to_vec()))
}

#[test]
fn vllms_model_list_is_read() {
    let body = br#"{"object":"list","data":[
        {"id":"qwen","object":"model","created":1,"owned_by":"vllm","root":"/m/qwen","parent":null,"max_model_len":4096,"permission":[]},
        {"id":"sql","object":"model","created":1,"owned_by":"vllm","root":"/a/sql","parent":"qwen","max_model_len":null,"permission":[]}]}"#;
    assert_eq!(
        cards(body),
        Some(vec![card("qwen", None), card("sql", Some("qwen"))])
    );
    assert_eq!(cards(b"not json"), None);
    assert_eq!(cards(br#"{"object":"list"}"#), None);
}

#[test]
fn a_name_goes_to_the_backends_that_list_it() {
    let c = catalog();
    let members = [addr(1), addr(2), addr(3)];
    let qwen = card("qwen", None);
    let changes = c.update(
        0,
        &members,
        vec![
            (addr(3), Some(vec![qwen.clone(), card("sql", Some("qwen"))])),
            (addr(1), Some(vec![qwen.clone()])),
            (addr(2), Some(vec![qwen.clone(), card("base", None)])),
        ],
        Instant::now(),
    );
    assert_eq!(
        changes.added,
        ["qwen", "sql"],
        "a configured name is never learned"
    );
    assert_eq!(backends(&c, "qwen"), Some((0, members.to_vec())));
    assert_eq!(backends(&c, "sql"), Some((0, vec![addr(3)])));
    assert!(c.served("sql").unwrap().serves(&addr(3)));
    assert!(!c.served("sql").unwrap().serves(&addr(1)));
    assert_eq!(
        c.list(),
        [("qwen".into(), None), ("sql".into(), Some("qwen".into()))]
    );
    assert!(c.served("base").is_none());
}

#[test]
fn a_silent_backend_keeps_its_answer_and_a_name_no_one_lists_goes() {
    let c = catalog();
    let members = [addr(1), addr(2)];
    c.update(
        0,
        &members,
        vec![
            (
                addr(1),
                Some(vec![card("qwen", None), card("sql", Some("qwen"))]),
            ),
            (addr(2), Some(vec![card("qwen", None)])),
        ],
        Instant::now(),
    );
    // addr(1) does not answer: it keeps its adapter.
    let changes = c.update(
        0,
        &members,
        vec![(addr(1), None), (addr(2), Some(vec![]))],
        Instant::now(),
    );
    assert_eq!(changes.removed, Vec::<String>::new());
    assert_eq!(backends(&c, "qwen"), Some((0, vec![addr(1)])));
    assert_eq!(backends(&c, "sql"), Some((0, vec![addr(1)])));
    // It answers again, without the adapter.
    let changes = c.update(
        0,
        &members,
        vec![(addr(1), Some(vec![card("qwen", None)]))],
        Instant::now(),
    );
    assert_eq!(changes.removed, ["sql"]);
    // It leaves the pool: its answer is forgotten.
    let changes = c.update(0, &[addr(2)], vec![], Instant::now());
    assert_eq!(changes.removed, ["qwen"]);
    assert!(c.list().is_empty());
}

#[test]
fn the_first_pool_in_the_file_serves_a_name_both_list() {
    let c = catalog();
    c.update(
        1,
        &[addr(9)],
        vec![(addr(9), Some(vec![card("qwen", None)]))],
        Instant::now(),
    );
    assert_eq!(backends(&c, "qwen"), Some((1, vec![addr(9)])));
    c.update(
        0,
        &[addr(1)],
        vec![(addr(1), Some(vec![card("qwen", None)]))],
        Instant::now(),
    );
    assert_eq!(backends(&c, "qwen"), Some((0, vec![addr(1)])));
}

#[test]
fn a_list_asked_before_a_load_does_not_erase_it() {
    let c = catalog();
    let members = [addr(1)];
    let qwen = || vec![card("qwen", None)];
    let asked = Instant::now() - std::time::Duration::from_millis(1);
    c.loaded(0, addr(1), card("hot", None));
    // The list in flight while the load ran: the adapter stays.
    let changes = c.update(0, &members, vec![(addr(1), Some(qwen()))], asked);
    assert_eq!(changes.removed, Vec::<String>::new());
    assert_eq!(backends(&c, "hot"), Some((0, vec![addr(1)])));
    // A list asked after the load settles it: confirmed, it stays
    // (listed once); then dropped by a later list, it goes.
    let mut listed = qwen();
    listed.push(card("hot", None));
    c.update(0, &members, vec![(addr(1), Some(listed))], Instant::now());
    assert_eq!(c.list().len(), 2);
    let changes = c.update(0, &members, vec![(addr(1), Some(qwen()))], Instant::now());
    assert_eq!(changes.removed, ["hot"]);
    // Loaded again, then dropped by a list asked after the load.
    c.loaded(0, addr(1), card("hot", None));
    let changes = c.update(0, &members, vec![(addr(1), Some(qwen()))], Instant::now());
    assert_eq!(changes.removed, ["hot"]);
}
