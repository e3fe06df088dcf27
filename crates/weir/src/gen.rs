//! `weir gen payments`: a realistic, reproducible payments stream for demos,
//! tests and benchmarks. The same seed always gives the same bytes.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use clap::ValueEnum;
use weir_engine::time::write_rfc3339_ms;

use crate::outfile::Sink;
use crate::Failure;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Profile {
    Realistic,
    Bench,
}

pub struct PaymentsArgs {
    pub events: u64,
    pub seed: u64,
    pub accounts: u64,
    pub rate: u64,
    pub profile: Profile,
    /// Later versions of recent payments per thousand events (see
    /// [`PaymentStream::with_corrections`]); `None`: the profile's default.
    pub corrections: Option<u64>,
}

/// Later versions per thousand events in the realistic profile.
pub const REALISTIC_CORRECTIONS: u64 = 5;

/// splitmix64: small, fast and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `per_mille / 1000`.
    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// 2026-11-29T00:00:00.000Z
pub const GEN_START_MS: i64 = 1_795_910_400_000;

struct Payment {
    id: u64,
    account: u64,
    cents: u64,
    currency: &'static str,
    status: &'static str,
    time: i64,
}

impl Payment {
    fn write(&self, out: &mut String) {
        use std::fmt::Write as _;
        let _ = write!(
            out,
            "{{\"payment_id\":\"pay-{:010}\",\"account_id\":\"acct-{:05}\",\"amount\":{}.{:02},\"currency\":\"{}\",\"status\":\"{}\",\"approved_at\":\"",
            self.id,
            self.account,
            self.cents / 100,
            self.cents % 100,
            self.currency,
            self.status
        );
        write_rfc3339_ms(self.time, out);
        out.push_str("\"}\n");
    }
}

/// An endless payments stream: each call writes the next line.
pub struct PaymentStream {
    rng: Rng,
    recent: Vec<Payment>,
    accounts: u64,
    realistic: bool,
    /// Malformed events stay JSON objects (for posting to the server, which
    /// refuses a body with a line that is not a JSON object).
    json_only: bool,
    next_id: u64,
    /// Later versions of a recent payment per thousand events.
    corrections: u64,
}

impl PaymentStream {
    pub fn new(seed: u64, accounts: u64, profile: Profile, json_only: bool) -> PaymentStream {
        PaymentStream {
            rng: Rng::new(seed),
            recent: Vec::with_capacity(1024),
            accounts: accounts.max(1),
            realistic: profile == Profile::Realistic,
            json_only,
            next_id: 0,
            corrections: if profile == Profile::Realistic { REALISTIC_CORRECTIONS } else { 0 },
        }
    }

    /// Payment ids from `first` on (another stream's ids are not versions of this one's).
    pub fn with_first_id(mut self, first: u64) -> PaymentStream {
        self.next_id = first;
        self
    }

    /// Per thousand events, a later version of a recent payment: half with
    /// another amount (a correction), half declined (under a contract whose
    /// `where` keeps approved payments, a deletion). Same id, account and time.
    pub fn with_corrections(mut self, per_mille: u64) -> PaymentStream {
        self.corrections = per_mille.min(1000);
        self
    }

    /// Writes one event line (with its newline) around event time `nominal`.
    pub fn next(&mut self, nominal: i64, out: &mut String) {
        let (rng, i) = (&mut self.rng, self.next_id);
        self.next_id += 1;
        // Re-sends: an exact duplicate, or a later version of the same payment.
        if !self.recent.is_empty() && rng.chance(10) {
            let again = &self.recent[rng.below(self.recent.len() as u64) as usize];
            again.write(out);
        } else if self.corrections > 0 && !self.recent.is_empty() && rng.chance(self.corrections) {
            let slot = rng.below(self.recent.len() as u64) as usize;
            let again = &self.recent[slot];
            let changed = if rng.chance(500) {
                Payment {
                    cents: again.cents + 1 + rng.below(500),
                    currency: again.currency,
                    status: again.status,
                    ..*again
                }
            } else {
                Payment { currency: again.currency, status: "declined", ..*again }
            };
            changed.write(out);
            self.recent[slot] = changed;
        } else if self.realistic && rng.chance(5) {
            malformed(rng, i, nominal, self.json_only, out);
        } else {
            let p = payment(rng, i, nominal, self.accounts, self.realistic);
            p.write(out);
            if self.recent.len() < 1024 {
                self.recent.push(p);
            } else {
                let slot = rng.below(1024) as usize;
                self.recent[slot] = p;
            }
        }
    }
}

pub fn payments(args: PaymentsArgs, output: Option<&Path>) -> Result<(), Failure> {
    if args.accounts == 0 || args.rate == 0 {
        return Err(Failure::usage("--accounts and --rate must be at least 1".into()));
    }
    let mut sink = Sink::create(output).map_err(Failure::usage_from)?;
    let mut stream = PaymentStream::new(args.seed, args.accounts, args.profile, false);
    if let Some(per_mille) = args.corrections {
        stream = stream.with_corrections(per_mille);
    }
    let mut text = String::with_capacity(1 << 17);
    let step_us = 1_000_000 / args.rate.max(1);
    for i in 0..args.events {
        let nominal = GEN_START_MS + (i * step_us / 1000) as i64;
        stream.next(nominal, &mut text);
        if text.len() >= 1 << 16 {
            sink.write(&text).map_err(Failure::run)?;
            text.clear();
        }
    }
    sink.write(&text).map_err(Failure::run)?;
    sink.commit().map_err(Failure::run)?;
    let _ = std::io::stderr().flush().context("stderr");
    Ok(())
}

fn payment(rng: &mut Rng, i: u64, nominal: i64, accounts: u64, realistic: bool) -> Payment {
    // Busy accounts pay more often: squaring a uniform skews toward small numbers.
    let u = rng.below(1 << 20);
    let account = ((((u * u) >> 20) * accounts) >> 20).min(accounts - 1);
    let cents = if rng.chance(100) { 10_000 + rng.below(500_000) } else { 100 + rng.below(20_000) };
    let currency = match rng.below(100) {
        0..=49 => "EUR",
        50..=84 => "USD",
        _ => "GBP",
    };
    let status = match rng.below(100) {
        0..=89 => "approved",
        90..=96 => "declined",
        _ => "refunded",
    };
    let mut time = nominal + rng.below(1000) as i64;
    if rng.chance(50) {
        // Out of order: up to 20 s behind the stream.
        time -= rng.below(20_000) as i64;
    } else if realistic && rng.chance(20) {
        // Late: behind by 30 s to 150 s.
        time -= 30_000 + rng.below(120_000) as i64;
    } else if realistic && rng.chance(3) {
        // Very late: one to three hours behind.
        time -= 3_600_000 + rng.below(7_200_000) as i64;
    }
    Payment { id: i, account, cents, currency, status, time }
}

fn malformed(rng: &mut Rng, i: u64, nominal: i64, json_only: bool, out: &mut String) {
    let mut good = String::new();
    Payment { id: i, account: rng.below(100), cents: 1999, currency: "EUR", status: "approved", time: nominal }
        .write(&mut good);
    let good = good.trim_end();
    match rng.below(5) {
        // Over HTTP every line must be a JSON object: bad inside, not in form.
        0 if json_only => out.push_str("{\"note\":\"an object without a payment's fields\"}"),
        0 => out.push_str(&good[..good.len() / 2]),
        1 if json_only => out.push_str(&good.replace("\"amount\":19.99", "\"amount\":{\"value\":19.99}")),
        1 => out.push_str("[\"not\",\"an\",\"object\"]"),
        2 => out.push_str(&good.replace("\"account_id\"", "\"acct\"")),
        3 => out.push_str(&good.replace("\"amount\":19.99", "\"amount\":\"n/a\"")),
        _ => {
            let at = good.find("\"approved_at\":").unwrap_or(0);
            out.push_str(&good[..at]);
            out.push_str("\"approved_at\":\"yesterday\"}");
        }
    }
    out.push('\n');
}
