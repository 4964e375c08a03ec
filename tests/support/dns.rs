//! A DNS server on 127.0.0.1 (UDP) for the tests: it answers A and AAAA
//! queries from a table the test changes while it runs, NXDOMAIN for a
//! name it does not know, SERVFAIL to every query (or to those of one type)
//! when told, and can stop.
//! Answers carry TTL 0, so every lookup reaches it.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

#[derive(Default)]
struct State {
    /// Lower-case names without the final dot.
    names: HashMap<String, Vec<IpAddr>>,
    /// The query types answered SERVFAIL.
    servfail: Vec<RecordType>,
}

pub struct DnsServer {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: Option<JoinHandle<()>>,
}

impl DnsServer {
    pub async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let task = tokio::spawn(serve(socket, state.clone()));
        DnsServer {
            addr,
            state,
            task: Some(task),
        }
    }

    /// `name` resolves to `ips` from now on (none: NXDOMAIN).
    pub fn set(&self, name: &str, ips: &[IpAddr]) {
        let mut st = self.state.lock().unwrap();
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        if ips.is_empty() {
            st.names.remove(&key);
        } else {
            st.names.insert(key, ips.to_vec());
        }
    }

    /// Answer SERVFAIL to every query (or stop doing so).
    pub fn servfail(&self, on: bool) {
        self.servfail_to(if on {
            &[RecordType::A, RecordType::AAAA]
        } else {
            &[]
        });
    }

    /// Answer SERVFAIL to the queries of these types only.
    pub fn servfail_to(&self, types: &[RecordType]) {
        self.state.lock().unwrap().servfail = types.to_vec();
    }

    /// Stop answering: the socket is closed.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve(socket: UdpSocket, state: Arc<Mutex<State>>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let reply = answer(&query, &state.lock().unwrap());
        if let Ok(bytes) = reply.to_vec() {
            let _ = socket.send_to(&bytes, from).await;
        }
    }
}

fn answer(query: &Message, st: &State) -> Message {
    let mut reply = Message::new(
        query.metadata.id,
        MessageType::Response,
        query.metadata.op_code,
    );
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_queries(query.queries.iter().cloned());
    if query
        .queries
        .iter()
        .any(|q| st.servfail.contains(&q.query_type()))
    {
        reply.metadata.response_code = ResponseCode::ServFail;
        return reply;
    }
    for q in &query.queries {
        let name = q.name().to_ascii();
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        let Some(ips) = st.names.get(&key) else {
            reply.metadata.response_code = ResponseCode::NXDomain;
            continue;
        };
        for ip in ips {
            let rdata = match (ip, q.query_type()) {
                (IpAddr::V4(v4), RecordType::A) => RData::A(A(*v4)),
                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(*v6)),
                _ => continue,
            };
            reply.add_answer(Record::from_rdata(q.name().clone(), 0, rdata));
        }
    }
    reply
}
