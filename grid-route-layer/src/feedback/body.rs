//! [`FeedbackBody`]: the response body after `FeedbackLayer`.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::usage::UsageReader;
use crate::grid::ClusterId;
use crate::metrics::{CACHED_PROMPT_TOKENS_TOTAL, CLUSTER_LABEL, PROMPT_TOKENS_TOTAL, SITE_LABEL};

pin_project! {
    /// The inner service's body, frame for frame and unchanged, while a copy of its data
    /// goes through a [`UsageReader`]. The usage found is counted when the body is
    /// dropped, read to its end or not.
    pub struct FeedbackBody<B> {
        #[pin]
        body: B,
        tally: Option<Tally>,
    }
}

/// The reader of one answer and the cluster it counts for.
struct Tally {
    reader: Option<UsageReader>,
    cluster: ClusterId,
}

impl Drop for Tally {
    fn drop(&mut self) {
        let Some(usage) = self.reader.take().and_then(UsageReader::finish) else {
            return;
        };
        let site = Arc::clone(self.cluster.site().as_arc());
        let cluster = Arc::clone(self.cluster.name_arc());
        metrics::counter!(
            PROMPT_TOKENS_TOTAL,
            SITE_LABEL => Arc::clone(&site),
            CLUSTER_LABEL => Arc::clone(&cluster)
        )
        .increment(usage.prompt_tokens);
        metrics::counter!(CACHED_PROMPT_TOKENS_TOTAL, SITE_LABEL => site, CLUSTER_LABEL => cluster)
            .increment(usage.cached_tokens);
    }
}

impl<B> FeedbackBody<B> {
    /// `body` passed through unread.
    pub(super) fn unread(body: B) -> Self {
        Self { body, tally: None }
    }

    /// `body` read by `reader` for `cluster`.
    pub(super) fn read(body: B, reader: UsageReader, cluster: ClusterId) -> Self {
        Self {
            body,
            tally: Some(Tally {
                reader: Some(reader),
                cluster,
            }),
        }
    }

    /// Whether the body's usage is being read.
    pub fn is_read(&self) -> bool {
        self.tally.is_some()
    }
}

impl<B> Body for FeedbackBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let frame = ready!(this.body.poll_frame(cx));
        if let (Some(Ok(frame)), Some(tally)) = (&frame, this.tally.as_mut())
            && let (Some(data), Some(reader)) = (frame.data_ref(), tally.reader.as_mut())
        {
            reader.feed(data);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
