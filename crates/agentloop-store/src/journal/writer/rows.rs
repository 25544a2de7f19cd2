//! The rows one write touches: a new run's, a step's (chained to the run's tail), a run's tail
//! read back from the file, and a fork's copy of another run's header and steps. Apart from the
//! commit, which only orders and groups them.

use agentloop::journal::{Definition, JournalError, JournalHeader, JournaledRun, RunStatus};
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;

use crate::journal::reader::read_steps;
use crate::journal::sum::{Sum, checked_header, header_sum, hex_text, parse_sum, step_sum};
use crate::journal::{ForkOrigin, io};

/// Where a run's next step goes: the run's number, its last step's sequence number (none before
/// the first) and that step's chained sum (the header's before the first).
#[derive(Clone)]
pub(super) struct Tail {
    pub(super) run_no: i64,
    pub(super) seq: Option<u64>,
    pub(super) sum: Sum,
}

/// Writes a new run's row, running; where its first step goes.
pub(super) fn insert_run(
    conn: &Connection,
    run_id: &str,
    agent: &str,
    fingerprint: &str,
    header: &str,
    now: i64,
) -> Result<Tail, JournalError> {
    let sum = header_sum(header);
    conn.prepare_cached(
        "INSERT INTO runs (run_id, agent, fingerprint, header, header_sum, status, \
         created_ms, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'running', ?6, ?6)",
    )
    .and_then(|mut insert| {
        insert.execute(params![
            run_id,
            agent,
            fingerprint,
            header,
            hex_text(&sum),
            now
        ])
    })
    .map_err(|e| io(format!("cannot start run {run_id}: {e}")))?;
    Ok(Tail {
        run_no: conn.last_insert_rowid(),
        seq: None,
        sum,
    })
}

/// Writes step `seq` of run number `run_no`, chained after `previous`; its sum.
pub(super) fn insert_step(
    conn: &Connection,
    run_no: i64,
    seq: u64,
    step: &str,
    previous: &Sum,
) -> Result<Sum, JournalError> {
    let sum = step_sum(previous, seq, step);
    let seq = i64::try_from(seq).map_err(io)?;
    conn.prepare_cached("INSERT INTO step_log (run_no, seq, step, sum) VALUES (?1, ?2, ?3, ?4)")
        .and_then(|mut insert| insert.execute(params![run_no, seq, step, sum.as_slice()]))
        .map_err(io)?;
    Ok(sum)
}

/// Where run `run_id`'s next step goes, from the file: its last step (its number and sum), or
/// its header's sum when it has none.
pub(super) fn tail(conn: &Connection, run_id: &str) -> Result<Tail, JournalError> {
    let run: Option<(i64, String)> = conn
        .query_row(
            "SELECT run_no, header_sum FROM runs WHERE run_id = ?1",
            [run_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(io)?;
    let Some((run_no, header)) = run else {
        return Err(JournalError::UnknownRun {
            run_id: run_id.to_owned(),
        });
    };
    let damaged = |step: Option<u64>| JournalError::Damaged {
        run_id: run_id.to_owned(),
        step,
        reason: "its checksum cannot be read".into(),
    };
    let last: Option<(i64, Vec<u8>)> = conn
        .query_row(
            "SELECT seq, sum FROM step_log WHERE run_no = ?1 ORDER BY seq DESC LIMIT 1",
            [run_no],
            |r| Ok((r.get(0)?, r.get_ref(1)?.as_bytes()?.to_vec())),
        )
        .optional()
        .map_err(io)?;
    match last {
        Some((seq, sum)) => {
            let seq = u64::try_from(seq).ok();
            Ok(Tail {
                run_no,
                seq,
                sum: Sum::try_from(sum.as_slice()).map_err(|_| damaged(seq))?,
            })
        }
        None => Ok(Tail {
            run_no,
            seq: None,
            sum: parse_sum(&header).ok_or_else(|| damaged(None))?,
        }),
    }
}

/// Writes run `run_id`: run `from`'s header (naming its origin, and with `definition` when
/// given) and its steps up to `at`, each checked on the way and chained anew. `from` is only
/// read.
pub(super) fn fork(
    conn: &Connection,
    from: &str,
    at: u64,
    run_id: &str,
    definition: Option<Definition>,
    logged: &[(u64, String)],
    now: i64,
) -> Result<(JournaledRun, Tail), JournalError> {
    let damaged = |step: Option<u64>, reason: String| JournalError::Damaged {
        run_id: from.to_owned(),
        step,
        reason,
    };
    let row: Option<(i64, String, String)> = conn
        .query_row(
            "SELECT run_no, header, header_sum FROM runs WHERE run_id = ?1",
            [from],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(io)?;
    let Some((from_no, text, stored)) = row else {
        return Err(JournalError::UnknownRun {
            run_id: from.to_owned(),
        });
    };
    let Some(sum) = checked_header(&text, &stored) else {
        return Err(damaged(None, "its checksum does not match".into()));
    };
    let mut value: Value = serde_json::from_str(&text)
        .map_err(|e| damaged(None, format!("it cannot be parsed ({e})")))?;
    let Some(fields) = value.as_object_mut() else {
        return Err(damaged(None, "it is not an object".into()));
    };
    fields.insert("run_id".into(), Value::String(run_id.to_owned()));
    let origin = ForkOrigin {
        run_id: from.to_owned(),
        step: at,
    };
    fields.insert(
        "forked_from".into(),
        serde_json::to_value(&origin).map_err(io)?,
    );
    if let Some(definition) = definition {
        fields.insert(
            "fingerprint".into(),
            Value::String(definition.fingerprint()),
        );
        fields.insert(
            "definition".into(),
            serde_json::to_value(&definition).map_err(io)?,
        );
    }
    let header: JournalHeader = serde_json::from_value(value.clone())
        .map_err(|e| damaged(None, format!("it cannot be parsed ({e})")))?;
    let text = serde_json::to_string(&value).map_err(io)?;
    let mut steps = Vec::new();
    let mut texts = Vec::new();
    let damage = read_steps(
        conn,
        from_no,
        &sum,
        Some(at),
        logged,
        &mut steps,
        &mut texts,
        damaged,
    )?;
    if let Some(e) = damage {
        return Err(e);
    }
    if (steps.len() as u64) <= at {
        return Err(JournalError::NotResumable {
            run_id: from.to_owned(),
            reason: format!(
                "it has no step {at} to fork at (it has {} step(s))",
                steps.len()
            ),
        });
    }
    let mut tail = insert_run(conn, run_id, &header.agent, &header.fingerprint, &text, now)?;
    for (seq, step) in (0u64..).zip(&texts) {
        tail.sum = insert_step(conn, tail.run_no, seq, step, &tail.sum)?;
        tail.seq = Some(seq);
    }
    let run = JournaledRun {
        header,
        steps,
        status: RunStatus::Running,
        approvals: Vec::new(),
    };
    Ok((run, tail))
}
