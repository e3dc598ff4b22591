//! The little of the RESP protocol a test needs: one command on a connection of its own, and its
//! reply.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A reply of the RESP protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A null.
    Nil,
    /// An integer.
    Int(i64),
    /// A simple or bulk string.
    Str(String),
    /// An error.
    Err(String),
    /// An array.
    Array(Vec<Reply>),
}

impl Reply {
    /// The integer, also one written as a string.
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            Reply::Str(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// The string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Reply::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Whether it is a null.
    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Nil)
    }
}

/// One command to the server on `port` (loopback), on a connection of its own.
pub fn command_at(port: u16, args: &[&str], timeout: Duration) -> std::io::Result<Reply> {
    command_on(port, None, args, timeout)
}

pub(crate) fn command_on(
    port: u16,
    password: Option<&str>,
    args: &[&str],
    timeout: Duration,
) -> std::io::Result<Reply> {
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    if let Some(password) = password {
        writer.write_all(&encode(&["AUTH", password]))?;
        read_reply(&mut reader)?;
    }
    writer.write_all(&encode(args))?;
    read_reply(&mut reader)
}

/// `args` as a RESP request.
pub fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad reply line {line:?}"),
        )
    };
    let (kind, rest) = line.split_at(1.min(line.len()));
    Ok(match kind {
        "+" => Reply::Str(rest.to_string()),
        "-" => Reply::Err(rest.to_string()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                Reply::Nil
            } else {
                let mut buf = vec![0; len as usize + 2];
                reader.read_exact(&mut buf)?;
                buf.truncate(len as usize);
                Reply::Str(String::from_utf8_lossy(&buf).into_owned())
            }
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                Reply::Nil
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Reply::Array(items)
            }
        }
        _ => return Err(bad()),
    })
}
