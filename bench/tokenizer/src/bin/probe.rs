//! Prints every candidate's ids for the given strings (JSON string syntax,
//! e.g. '"\u0301\ud804\udfce"'), marking those that differ from hf-fancy:
//! `probe [--model NAME] STRING...`
fn main() {
    tokbench::single_threaded();
    let (model, args) = tokbench::model_and_args();
    let dir = tokbench::model_dir(&model);
    let cands: Vec<_> = tokbench::names()
        .into_iter()
        .filter_map(|n| tokbench::load(n, &dir).ok().map(|c| (n, c)))
        .collect();
    for a in args {
        let text: String = serde_json::from_str(&a).unwrap_or(a);
        println!("{text:?}");
        let want = cands[0].1.encode(&text);
        for (n, c) in &cands {
            let got = c.encode(&text);
            println!("  {} {n:10} {got:?}", if got == want { " " } else { "≠" });
        }
    }
}
