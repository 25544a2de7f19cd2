//! Default prices (USD per million tokens) for the common models of the three APIs, as published
//! by OpenAI and Anthropic when this table was written. Prices change: extend or override the
//! table with [`PriceTable::insert`] or [`PriceTable::extend`].
//!
//! Names match exactly, or as a dated snapshot of an entry (see [`PriceTable`]):
//! `gpt-4.1-mini-2025-04-14` finds `gpt-4.1-mini` and `claude-sonnet-4-5-20250929` finds
//! `claude-sonnet-4-5`, but `o1-pro` is its own entry, never `o1`. A model not in the table is
//! unpriced: give it a price, or a budget in USD cannot hold (the agent refuses to start).

use agentloop::{Price, PriceTable};

/// `(model, input, output, cached input, cache write)` in USD per million tokens. A cache-write
/// price of `None` means the provider charges the input price (OpenAI caches for free).
const PRICES: &[(&str, f64, f64, f64, Option<f64>)] = &[
    // OpenAI
    ("gpt-5", 1.25, 10.0, 0.125, None),
    ("gpt-5-mini", 0.25, 2.0, 0.025, None),
    ("gpt-5-nano", 0.05, 0.40, 0.005, None),
    ("gpt-4.1", 2.0, 8.0, 0.50, None),
    ("gpt-4.1-mini", 0.40, 1.60, 0.10, None),
    ("gpt-4.1-nano", 0.10, 0.40, 0.025, None),
    ("gpt-4o", 2.50, 10.0, 1.25, None),
    ("gpt-4o-mini", 0.15, 0.60, 0.075, None),
    ("o1", 15.0, 60.0, 7.50, None),
    ("o1-mini", 1.10, 4.40, 0.55, None),
    // No cached-input discount: cached tokens cost the input price.
    ("o1-pro", 150.0, 600.0, 150.0, None),
    ("o3", 2.0, 8.0, 0.50, None),
    ("o3-pro", 20.0, 80.0, 20.0, None),
    ("o3-mini", 1.10, 4.40, 0.55, None),
    ("o4-mini", 1.10, 4.40, 0.275, None),
    // Anthropic (cache write at the 5-minute rate: 1.25 times the input price)
    ("claude-opus-4", 15.0, 75.0, 1.50, Some(18.75)),
    ("claude-opus-4-1", 15.0, 75.0, 1.50, Some(18.75)),
    ("claude-opus-4-5", 5.0, 25.0, 0.50, Some(6.25)),
    ("claude-sonnet-4", 3.0, 15.0, 0.30, Some(3.75)),
    ("claude-sonnet-4-5", 3.0, 15.0, 0.30, Some(3.75)),
    ("claude-haiku-4-5", 1.0, 5.0, 0.10, Some(1.25)),
    ("claude-3-7-sonnet", 3.0, 15.0, 0.30, Some(3.75)),
    ("claude-3-5-sonnet", 3.0, 15.0, 0.30, Some(3.75)),
    ("claude-3-5-haiku", 0.80, 4.0, 0.08, Some(1.0)),
    ("claude-3-opus", 15.0, 75.0, 1.50, Some(18.75)),
    ("claude-3-haiku", 0.25, 1.25, 0.03, Some(0.30)),
];

/// The default price table: the models above, ready to extend or override.
pub fn default_prices() -> PriceTable {
    let mut table = PriceTable::new();
    for &(model, input, output, cached, write) in PRICES {
        let mut price = Price::new(input, output).with_cached_input(cached);
        price.cache_write = write;
        table.insert(model, price);
    }
    table
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use agentloop::{limits::Pricing, model::Usage};

    #[test]
    fn dated_snapshots_find_their_base_entry() {
        let t = default_prices();
        assert_eq!(t.get("gpt-4.1-mini-2025-04-14").unwrap().input, 0.40);
        assert_eq!(t.get("gpt-4o-2024-08-06").unwrap().input, 2.50);
        assert_eq!(t.get("gpt-4o-mini-2024-07-18").unwrap().input, 0.15);
        assert_eq!(t.get("claude-3-5-sonnet-20241022").unwrap().input, 3.0);
        assert_eq!(t.get("claude-sonnet-4-5-20250929").unwrap().output, 15.0);
        assert_eq!(t.get("claude-opus-4-5-20251101").unwrap().input, 5.0);
        assert_eq!(t.get("claude-3-5-sonnet-latest").unwrap().input, 3.0);
        assert_eq!(t.get("claude-3-5-sonnet@20240620").unwrap().input, 3.0);
        assert_eq!(t.get("o1-pro-2025-03-19").unwrap().input, 150.0);
    }

    #[test]
    fn a_name_that_only_starts_like_an_entry_is_another_model() {
        let t = default_prices();
        let o1_pro = t.get("o1-pro").unwrap();
        assert_eq!((o1_pro.input, o1_pro.output), (150.0, 600.0));
        assert_eq!(t.get("o1-mini").unwrap().input, 1.10);
        assert_eq!(t.get("o3-pro").unwrap().output, 80.0);
        for unpriced in [
            "gpt-4o-audio-preview",
            "gpt-4.1-mini-fast",
            "o1-preview",
            "gpt-4o-2024",
            "gpt-4o-20241",
            "claude-3-5-sonnet-v2",
            "gpt-4o-2024-08-06-extra",
            "llama3",
            "-latest",
            "@20240101",
        ] {
            assert!(t.get(unpriced).is_none(), "{unpriced} is priced");
        }
    }

    #[test]
    fn openai_cost_counts_cached_tokens_inside_input_at_the_cached_price() {
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            cached_input_tokens: 500_000,
            ..Default::default()
        };
        let cost = default_prices().cost("openai", "gpt-4.1", &usage).unwrap();
        // 0.5M uncached * 2 + 0.5M cached * 0.5 + 1M out * 8
        assert!((cost - (1.0 + 0.25 + 8.0)).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn anthropic_cost_prices_cache_reads_and_writes_inside_the_input() {
        // Usage as the adapter reports it: 1M uncached + 1M read + 1M written = 3M input.
        let usage = Usage {
            input_tokens: 3_000_000,
            output_tokens: 0,
            cached_input_tokens: 1_000_000,
            cache_write_tokens: 1_000_000,
            ..Default::default()
        };
        let table = default_prices();
        let cost = table.cost("anthropic", "claude-haiku-4-5", &usage).unwrap();
        assert!((cost - (1.0 + 0.10 + 1.25)).abs() < 1e-9, "{cost}");
        // The provider name no longer changes what the counts mean.
        assert_eq!(table.cost("openai", "claude-haiku-4-5", &usage), Some(cost));
    }

    #[test]
    fn counts_that_do_not_add_up_never_price_below_zero() {
        let usage = Usage {
            input_tokens: 10,
            cached_input_tokens: u64::MAX,
            cache_write_tokens: 5,
            ..Default::default()
        };
        let cost = default_prices().cost("openai", "gpt-4.1", &usage).unwrap();
        assert!(cost.is_finite() && cost > 0.0, "{cost}");
    }

    #[test]
    fn user_entries_override_defaults() {
        let mut t = default_prices();
        t.insert("gpt-4.1", Price::new(1.0, 1.0));
        assert_eq!(t.get("gpt-4.1-2025-04-14").unwrap().output, 1.0);
    }
}
