//! Runs that outlive a gateway: leases renewed, controls posted by other gateways taken, orphaned
//! runs taken over, unfinished runs resumed after a restart.

use std::sync::Arc;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;

use super::{CONTROL_POLL, Engine, Live};
use crate::clock::is_terminal;
use crate::ctx::RunCtx;
use crate::store::{self, StoredRun};

impl Engine {
    /// On a shared store, keep this gateway's runs and take over orphaned ones, until halted:
    /// renew the leases of the runs executing here (a run whose lease was lost stops here), take
    /// controls other gateways posted for them, and resume unfinished runs whose lease expired.
    /// Nothing to do on a store of one gateway.
    pub async fn supervise(&self, lease: std::time::Duration) {
        if !self.store.shared() {
            return;
        }
        let mut halt = self.halt.subscribe();
        let renew_every = lease / 3;
        let mut last_renew = tokio::time::Instant::now();
        let mut last_look = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(CONTROL_POLL) => {}
                _ = halt.wait_for(|h| *h) => return,
            }
            let live: Vec<(String, Arc<Live>)> =
                self.live.lock().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
            let ids: Vec<String> = live.iter().map(|(k, _)| k.clone()).collect();
            match self.store.posted_controls(&ids).await {
                Ok(posted) => {
                    for p in posted {
                        let kept = match self.control(p.request.clone()).await {
                            Ok(_) => self.store.remove_control(p.id).await,
                            // Kept, with the refusal, for the gateway that posted it to answer with.
                            Err(e) => {
                                tracing::info!(run_id = %p.request.run_id, error = %e, "posted control refused");
                                let status = assay_rpc::to_status(e);
                                let refusal = store::ControlRefusal {
                                    code: status.code() as i32,
                                    message: status.message().to_string(),
                                    details: status.details().to_vec(),
                                };
                                self.store.refuse_control(p.id, refusal).await
                            }
                        };
                        if let Err(e) = kept {
                            tracing::warn!(error = %e, "could not record a posted control's outcome");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not read posted controls"),
            }
            if last_look.elapsed() >= super::help::LOOK_EVERY {
                last_look = tokio::time::Instant::now();
                self.look_for_help().await;
            }
            if last_renew.elapsed() < renew_every {
                continue;
            }
            last_renew = tokio::time::Instant::now();
            match self.store.renew(&ids).await {
                Ok(lost) => {
                    for run_id in lost {
                        if let Some((_, l)) = live.iter().find(|(k, _)| *k == run_id) {
                            l.lost.send_replace(true);
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not renew run leases"),
            }
            match self.store.claim_orphans(false).await {
                Ok(runs) => {
                    for stored in runs {
                        if self.live(&stored.run.run_id).is_some() {
                            continue;
                        }
                        tracing::info!(run_id = %stored.run.run_id, "taking over a run whose lease expired");
                        if let Err(e) = self.resume(stored, "taken over from a gateway whose lease expired").await {
                            tracing::error!(error = %e, "could not take over a run");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not look for orphaned runs"),
            }
        }
    }

    /// Resume every run left unfinished by a previous gateway process (any state but the terminal
    /// ones) that no other gateway executes: each pipeline is rebuilt from its stored request and
    /// goes on from its checkpoints; a paused run stays paused until resumed or cancelled.
    pub async fn resume_unfinished(&self) -> Result<usize, StageError> {
        let runs = self.store.claim_orphans(true).await?;
        let n = runs.len();
        for stored in runs {
            self.resume(stored, "resumed after a gateway restart").await?;
        }
        Ok(n)
    }

    /// Execute a stored unfinished run here, from its checkpoints.
    async fn resume(&self, stored: StoredRun, why: &str) -> Result<(), StageError> {
        let StoredRun { run, request } = stored;
        {
            if is_terminal(run.state) {
                return Ok(());
            }
            let last = self.store.events_after(&run.run_id, 0).await?.last().map_or(0, |e| e.sequence);
            let run_id = run.run_id.clone();
            let run_state = run.state;
            // A resumed run is never refused: the caps' ceiling stops it where they are reached.
            let spend = match &self.spend {
                Some(c) => {
                    let backends = c.capped_backends_of(&request);
                    if let Err(e) = c.refresh(&backends).await {
                        tracing::warn!(run_id = %run_id, error = %e, "could not read today's spend of the capped backends");
                    }
                    Some((c.clone(), backends))
                }
                None => None,
            };
            let ctx = Arc::new(self.capped(RunCtx::new(run, last, Some(self.store.clone())), spend));
            let pipeline = match self.factory.parse(&request) {
                Ok(p) => p,
                Err(e) => {
                    // A stored request this gateway cannot run any more fails its run.
                    self.finish(&ctx, Err(e)).await?;
                    return Ok(());
                }
            };
            // A paused run stays paused (controllable: resume or cancel), a run waiting for a
            // human keeps waiting; any other unfinished state goes on running.
            let (state, reason) = if run_state == gw::RunState::Paused as i32 {
                ctx.gate.paused.send_replace(true);
                (gw::RunState::Paused, "recovered after a gateway restart; paused until resumed")
            } else if run_state == gw::RunState::AwaitingHuman as i32 {
                (gw::RunState::AwaitingHuman, "recovered after a gateway restart; waiting for a human decision")
            } else {
                (gw::RunState::Running, why)
            };
            ctx.update(|r| r.state = state as i32);
            ctx.log
                .emit(Event::StateChanged(gw::RunStateChanged { state: state as i32, reason: reason.into() }))
                .await?;
            tracing::info!(run_id = %run_id, "resuming run");
            let slot = self.readmit();
            self.spawn(Live::new(ctx, pipeline), slot);
        }
        Ok(())
    }
}
