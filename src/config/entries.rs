//! List entries written as a string or as a map (`listen`, a model's
//! `addresses`): `"ip:port"` or `{address: "ip:port", ...}`.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// One entry written as a string or as a map. Unlike `#[serde(untagged)]`,
/// an error inside the map (a typo, a missing field) is reported as itself,
/// with its path.
#[derive(Debug)]
pub struct Entry<M>(pub M);

/// One entry or a list of entries (see `Entry`).
#[derive(Debug)]
pub struct OneOrMany<M>(pub Vec<M>);

struct EntryVisitor<M>(PhantomData<M>);

impl<'de, M: Deserialize<'de> + From<String>> Visitor<'de> for EntryVisitor<M> {
    type Value = M;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an address \"ip:port\" or a map with `address`")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<M, E> {
        Ok(M::from(s.to_string()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<M, A::Error> {
        M::deserialize(MapAccessDeserializer::new(map))
    }
}

impl<'de, M: Deserialize<'de> + From<String>> Deserialize<'de> for Entry<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(EntryVisitor(PhantomData)).map(Entry)
    }
}

struct OneOrManyVisitor<M>(PhantomData<M>);

impl<'de, M: Deserialize<'de> + From<String>> Visitor<'de> for OneOrManyVisitor<M> {
    type Value = Vec<M>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an address \"ip:port\", a map with `address`, or a list of them")
    }

    fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Vec<M>, E> {
        EntryVisitor(PhantomData).visit_str(s).map(|m| vec![m])
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<M>, A::Error> {
        EntryVisitor(PhantomData).visit_map(map).map(|m| vec![m])
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<M>, A::Error> {
        let mut out = Vec::new();
        while let Some(Entry(m)) = seq.next_element::<Entry<M>>()? {
            out.push(m);
        }
        Ok(out)
    }
}

impl<'de, M: Deserialize<'de> + From<String>> Deserialize<'de> for OneOrMany<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(OneOrManyVisitor(PhantomData))
            .map(OneOrMany)
    }
}

/// For the key test: the list form, whose keys the one-entry shorthand
/// shares (a key of an entry is `listen[].address` either way).
#[cfg(test)]
impl<M: schemars::JsonSchema> schemars::JsonSchema for OneOrMany<M> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("OneOrMany_{}", M::schema_name()).into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "array", "items": g.subschema_for::<Entry<M>>()})
    }
}

/// For the key test: a string or the map form.
#[cfg(test)]
impl<M: schemars::JsonSchema> schemars::JsonSchema for Entry<M> {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        format!("Entry_{}", M::schema_name()).into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"anyOf": [{"type": "string"}, g.subschema_for::<M>()]})
    }
}
