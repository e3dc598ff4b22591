//! A short list that is kept inline while it is short, for the lists every operation makes: who
//! votes and who granted in a quorum round (one item per master), and an operation's reply (a few
//! integers). Each would otherwise cost an allocation per acquisition or release.

/// How many items a [`Few`] keeps inline.
const INLINE: usize = 8;

/// A short list kept inline up to [`INLINE`] items, in a `Vec` beyond (all of them then).
#[derive(Default)]
pub(crate) struct Few<T> {
    inline: [T; INLINE],
    more: Vec<T>,
    len: usize,
}

impl<T: Copy + Default> Few<T> {
    pub(crate) fn push(&mut self, item: T) {
        if self.len < INLINE {
            self.inline[self.len] = item;
        } else {
            if self.len == INLINE {
                self.more.extend_from_slice(&self.inline);
            }
            self.more.push(item);
        }
        self.len += 1;
    }
}

impl<T> Few<T> {
    /// The items, in order.
    pub(crate) fn as_slice(&self) -> &[T] {
        self
    }
}

impl<T> std::ops::Deref for Few<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.len <= INLINE {
            &self.inline[..self.len]
        } else {
            &self.more
        }
    }
}

impl<T: Copy + Default> FromIterator<T> for Few<T> {
    fn from_iter<I: IntoIterator<Item = T>>(items: I) -> Few<T> {
        let mut few = Few::default();
        for item in items {
            few.push(item);
        }
        few
    }
}

#[cfg(test)]
mod tests {
    use super::Few;

    #[test]
    fn a_few_keeps_every_item_in_order_inline_and_beyond() {
        let mut few = Few::<u32>::default();
        assert!(few.is_empty());
        for n in 0..20 {
            few.push(n);
            assert_eq!(&*few, (0..=n).collect::<Vec<_>>());
        }
        let collected: Few<u32> = (0..3).collect();
        assert_eq!(&*collected, [0, 1, 2]);
    }
}
