//! Notice for spot buyers over HTTP, against the built components: a reclaim with
//! `noticeSeconds` (and its dry run), VMs whose notice runs out derived from the clock on
//! every read and written down by the next write, refusals naming the VM and the time,
//! notices shortened and never lengthened, the owner stopping early, releases bounded by
//! `until`, and the events feed. The clock is moved and stopped by the host (never slept
//! through), so every boundary is looked at exactly: `terminatesAt` itself and the
//! millisecond before it.

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use serde_json::{Value, json};

use api_support::{
    App, Client, Reply, ReservationSpec, Scenario, assert_invalid_parameters, place_vm,
    rfc3339_from_now, strings,
};

const NODE: &str = "n1";
const OWNER: &str = "owner";
const AUDIENCE: &str = "aud";
const MANAGER: &str = "mgr";
const BUYER: &str = "buyer";
const OTHER_BUYER: &str = "buyer2";
const UNITS: [&str; 8] = ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g7"];

/// Node `n1` of `owner` with reservation A on g0..g3 (audience `aud`, managed by `mgr`, ending
/// in two days) and reservation B on g4..g5 (the same parties, open-ended). The clock stands
/// still at `now` (a whole second) until a test moves it.
struct World {
    app: App,
    now: DateTime<Utc>,
    a: String,
    b: String,
    a_ends_at: String,
    owner: Client,
    manager: Client,
    audience: Client,
    buyer: Client,
    other_buyer: Client,
}

/// The items of the first page of a listing.
fn first_page(client: &Client, path: &str) -> Vec<Value> {
    let page = client.get(path).expect_status(200).json();
    page["items"].as_array().expect("items").clone()
}

fn at(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl World {
    fn open() -> World {
        let scene = Scenario::new()
            .orgs(&[OWNER, AUDIENCE, MANAGER, BUYER, OTHER_BUYER])
            .node(NODE, OWNER, &UNITS)
            .reservation(
                "a",
                ReservationSpec::on(NODE, &["g0", "g1", "g2", "g3"])
                    .audience(&[AUDIENCE])
                    .managers(&[MANAGER])
                    .ends_in(2 * 86_400),
            )
            .reservation(
                "b",
                ReservationSpec::on(NODE, &["g4", "g5"])
                    .audience(&[AUDIENCE])
                    .managers(&[MANAGER]),
            )
            .key("owner", OWNER, "capacity-manager")
            .key("manager", MANAGER, "capacity-manager")
            .key("audience", AUDIENCE, "member")
            .key("buyer", BUYER, "member")
            .key("other buyer", OTHER_BUYER, "member")
            .open();
        let now = DateTime::from_timestamp(Utc::now().timestamp(), 0).expect("now");
        scene.app.freeze_clock_at(&at(now));
        let a_ends_at = scene.reservation("a").request["endsAt"]
            .as_str()
            .expect("endsAt");
        World {
            a: scene.reservation_id("a"),
            b: scene.reservation_id("b"),
            a_ends_at: at(DateTime::parse_from_rfc3339(a_ends_at)
                .expect("endsAt")
                .with_timezone(&Utc)),
            now,
            owner: scene.client("owner"),
            manager: scene.client("manager"),
            audience: scene.client("audience"),
            buyer: scene.client("buyer"),
            other_buyer: scene.client("other buyer"),
            app: scene.app,
        }
    }

    /// The instant `seconds` after the world's `now`.
    fn plus(&self, seconds: i64) -> DateTime<Utc> {
        self.now + TimeDelta::seconds(seconds)
    }

    fn freeze(&self, t: DateTime<Utc>) {
        self.app.freeze_clock_at(&at(t));
    }

    fn path(&self, reservation: &str, op: &str) -> String {
        format!("/v1/nodes/{NODE}/reservations/{reservation}/{op}")
    }

    fn release(&self, reservation: &str, units: &[&str], until: Option<&str>) -> Value {
        let mut body = json!({ "unitIds": units, "reason": "idle" });
        if let Some(until) = until {
            body["until"] = json!(until);
        }
        self.owner
            .post(&self.path(reservation, "release"), &body)
            .expect_status(200)
            .json()
    }

    fn reclaim_reply(
        &self,
        op: &str,
        reservation: &str,
        units: &[&str],
        notice: Option<i64>,
    ) -> Reply {
        let mut body = json!({ "unitIds": units, "reason": "training starts" });
        if let Some(notice) = notice {
            body["noticeSeconds"] = json!(notice);
        }
        self.owner.post(&self.path(reservation, op), &body)
    }

    fn reclaim(&self, reservation: &str, units: &[&str], notice: Option<i64>) -> Value {
        self.reclaim_reply("reclaim", reservation, units, notice)
            .expect_status(200)
            .json()
    }

    fn dry_run(&self, reservation: &str, units: &[&str], notice: Option<i64>) -> Value {
        self.reclaim_reply("reclaim/dry-run", reservation, units, notice)
            .expect_status(200)
            .json()
    }

    fn vm(&self, client: &Client, id: &str) -> Value {
        client
            .get(&format!("/v1/vms/{id}"))
            .expect_status(200)
            .json()
    }

    fn reservation(&self, id: &str) -> Value {
        self.owner
            .get(&format!("/v1/nodes/{NODE}/reservations/{id}"))
            .expect_status(200)
            .json()
    }

    fn vm_ids(&self, client: &Client, status: &str) -> Vec<String> {
        first_page(client, &format!("/v1/vms?nodeId={NODE}&status={status}"))
            .iter()
            .map(|vm| vm["id"].as_str().expect("id").to_owned())
            .collect()
    }

    fn market_units(&self) -> Vec<(String, Option<String>)> {
        first_page(&self.buyer, &format!("/v1/market?nodeId={NODE}"))
            .iter()
            .map(|o| {
                (
                    o["unitId"].as_str().expect("unitId").to_owned(),
                    o["endsAt"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }

    /// The row of a VM as the database holds it: (status, termination reason, running units).
    fn vm_row(&self, id: &str) -> (String, Option<String>, i64) {
        self.app
            .db()
            .query_row(
                "SELECT status, termination_reason, \
                 (SELECT count(*) FROM vm_units WHERE vm_id = vms.id AND running = 1) \
                 FROM vms WHERE id = ?",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .expect("the VM's row")
    }
}

fn problem_refusals(problem: &Value) -> Vec<Value> {
    problem["refusals"].as_array().expect("refusals").clone()
}

#[test]
fn a_reclaim_with_notice_lets_spot_vms_run_until_their_deadline_and_no_longer() {
    let w = World::open();
    w.release(&w.a, &["g1", "g2"], None);
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();
    let community = place_vm(&w.audience, NODE, &["g0"], "community").created_id();
    let deadline = at(w.plus(600));

    // The dry run says exactly what the reclaim then does, deadlines included.
    let dry = w.dry_run(&w.a, &["g1", "g0"], Some(600));
    assert_eq!(strings(&dry["wouldTerminate"]), vec![spot.clone()]);
    assert_eq!(strings(&dry["wouldSkip"]), vec![community.clone()]);
    assert_eq!(dry["terminatesAt"], json!({ &spot: deadline }));
    let reclaimed = w.reclaim(&w.a, &["g1", "g0"], Some(600));
    assert_eq!(
        strings(&reclaimed["terminated"]),
        strings(&dry["wouldTerminate"])
    );
    assert_eq!(strings(&reclaimed["skipped"]), strings(&dry["wouldSkip"]));
    assert_eq!(reclaimed["terminatesAt"], dry["terminatesAt"]);
    // The units leave the market at once.
    assert_eq!(strings(&reclaimed["releasedUnitIds"]), vec!["g2"]);
    assert_eq!(
        w.market_units(),
        vec![("g2".to_owned(), Some(w.a_ends_at.clone()))]
    );

    // The buyer's VM runs on, and says until when and why; which reservation took the unit
    // back is for the reservation's parties, who read the VM as the capacity's managers.
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["status"], "running");
    assert_eq!(
        vm["interruption"],
        json!({
            "reason": "reclaimed",
            "noticedAt": at(w.now),
            "terminatesAt": deadline,
            "unitIds": ["g1"],
        })
    );
    assert_eq!(
        w.vm(&w.owner, &spot)["interruption"]["reservationId"],
        json!(w.a)
    );
    assert_eq!(w.vm(&w.audience, &community)["status"], "running");

    // Until then the unit is busy: the audience is told which VM and until when; a stranger
    // to the reservation only that the unit is not available.
    let problem =
        place_vm(&w.audience, NODE, &["g1"], "community").expect_problem(409, "placement-refused");
    assert_eq!(
        problem_refusals(&problem),
        vec![
            json!({ "unitId": "g1", "reason": "unit-under-notice", "vmId": spot, "terminatesAt": deadline })
        ]
    );
    let problem =
        place_vm(&w.other_buyer, NODE, &["g1"], "spot").expect_problem(409, "placement-refused");
    assert_eq!(
        problem_refusals(&problem),
        vec![json!({ "unitId": "g1", "reason": "unavailable" })]
    );

    // The millisecond before the deadline: still running, everywhere.
    w.freeze(w.plus(600) - TimeDelta::milliseconds(1));
    assert_eq!(w.vm(&w.buyer, &spot)["status"], "running");
    assert!(w.vm_ids(&w.owner, "running").contains(&spot));
    assert_eq!(
        strings(&w.dry_run(&w.a, &["g1"], None)["wouldTerminate"]),
        vec![spot.clone()]
    );

    // At the deadline itself: terminated, everywhere, with nothing run in the background.
    w.freeze(w.plus(600));
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["status"], "terminated");
    assert_eq!(vm["terminationReason"], "reclaimed");
    assert_eq!(vm["terminatedAt"], deadline);
    assert_eq!(vm["interruption"]["terminatesAt"], deadline);
    assert!(!w.vm_ids(&w.owner, "running").contains(&spot));
    assert!(w.vm_ids(&w.owner, "terminated").contains(&spot));
    let dry = w.dry_run(&w.a, &["g1"], Some(600));
    assert_eq!(dry["wouldTerminate"], json!([]));
    assert!(dry.get("terminatesAt").is_none(), "{dry}");
    // The row still says running until a write touches it...
    assert_eq!(w.vm_row(&spot), ("running".to_owned(), None, 1));
    // ...and the next placement on the unit writes the termination down.
    let next = place_vm(&w.audience, NODE, &["g1"], "community").created_id();
    assert_eq!(
        w.vm_row(&spot),
        ("terminated".to_owned(), Some("reclaimed".to_owned()), 0)
    );
    assert_eq!(w.vm(&w.buyer, &spot)["terminatedAt"], deadline);
    assert_eq!(w.vm(&w.audience, &next)["status"], "running");
}

#[test]
fn a_later_reclaim_shortens_a_notice_and_never_lengthens_it() {
    let w = World::open();
    w.release(&w.a, &["g1"], None);
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();
    let first = w.reclaim(&w.a, &["g1"], Some(600));
    assert_eq!(first["terminatesAt"][&spot], at(w.plus(600)));

    // A longer notice later keeps the earlier deadline, in the dry run and the reclaim.
    w.freeze(w.plus(100));
    let dry = w.dry_run(&w.a, &["g1"], Some(3600));
    assert_eq!(dry["terminatesAt"][&spot], at(w.plus(600)));
    let longer = w.reclaim(&w.a, &["g1"], Some(3600));
    assert_eq!(longer["terminatesAt"][&spot], at(w.plus(600)));
    assert_eq!(
        w.vm(&w.buyer, &spot)["interruption"]["terminatesAt"],
        at(w.plus(600))
    );
    assert_eq!(
        w.vm(&w.buyer, &spot)["interruption"]["noticedAt"],
        at(w.now)
    );

    // A shorter one moves it earlier.
    let shorter = w.reclaim(&w.a, &["g1"], Some(60));
    assert_eq!(shorter["terminatesAt"][&spot], at(w.plus(160)));
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["interruption"]["terminatesAt"], at(w.plus(160)));
    assert_eq!(vm["interruption"]["noticedAt"], at(w.plus(100)));

    // No notice at all: it stops now, as the v1 contract says.
    let now = w.reclaim(&w.a, &["g1"], None);
    assert_eq!(strings(&now["terminated"]), vec![spot.clone()]);
    assert!(now.get("terminatesAt").is_none(), "{now}");
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["status"], "terminated");
    assert_eq!(vm["terminatedAt"], at(w.plus(100)));

    // The database itself refuses a later deadline.
    let refused = w.app.node_db(NODE).execute(
        "UPDATE vms SET terminates_at = terminates_at + 1000 WHERE id = ?",
        [&spot],
    );
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("notice-lengthened")),
        "{refused:?}"
    );
}

#[test]
fn the_owner_of_a_vm_under_notice_may_stop_it_early() {
    let w = World::open();
    w.release(&w.a, &["g1"], None);
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();
    w.reclaim(&w.a, &["g1"], Some(300));
    w.freeze(w.plus(10));
    let stopped = w
        .buyer
        .delete(&format!("/v1/vms/{spot}"))
        .expect_status(200)
        .json();
    assert_eq!(stopped["status"], "terminated");
    assert_eq!(stopped["terminationReason"], "stopped");
    assert_eq!(stopped["terminatedAt"], at(w.plus(10)));
    // The unit is free for the audience at once, and the stopped VM stays stopped after
    // its old deadline.
    place_vm(&w.audience, NODE, &["g1"], "community").created_id();
    w.freeze(w.plus(400));
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["terminationReason"], "stopped");
    assert_eq!(vm["terminatedAt"], at(w.plus(10)));
    // Stopping it again is the usual conflict, as is stopping a VM whose notice ran out.
    w.buyer
        .delete(&format!("/v1/vms/{spot}"))
        .expect_problem(409, "vm-terminated");
    w.release(&w.a, &["g2"], None);
    let other = place_vm(&w.buyer, NODE, &["g2"], "spot").created_id();
    w.reclaim(&w.a, &["g2"], Some(60));
    w.freeze(w.plus(460));
    w.buyer
        .delete(&format!("/v1/vms/{other}"))
        .expect_problem(409, "vm-terminated");
}

#[test]
fn a_notice_on_a_vm_spanning_two_reservations_names_each_reservation_s_units() {
    let w = World::open();
    w.release(&w.a, &["g3"], None);
    w.release(&w.b, &["g4"], None);
    let spot = place_vm(&w.buyer, NODE, &["g3", "g4"], "spot").created_id();

    let from_a = w.reclaim(&w.a, &["g3"], Some(600));
    assert_eq!(from_a["terminatesAt"][&spot], at(w.plus(600)));
    let interruption = w.vm(&w.owner, &spot)["interruption"].clone();
    assert_eq!(interruption["reservationId"], json!(w.a));
    assert_eq!(interruption["unitIds"], json!(["g3"]));
    // B still has g4 released, but the VM holds it until its deadline.
    assert_eq!(strings(&w.reservation(&w.b)["releasedUnitIds"]), vec!["g4"]);
    assert!(w.market_units().iter().all(|(unit, _)| unit != "g4"));

    // B's reclaim with a shorter notice moves the deadline and names B's unit.
    w.freeze(w.plus(30));
    let from_b = w.reclaim(&w.b, &["g4"], Some(60));
    assert_eq!(from_b["terminatesAt"][&spot], at(w.plus(90)));
    let interruption = w.vm(&w.owner, &spot)["interruption"].clone();
    assert_eq!(interruption["reservationId"], json!(w.b));
    assert_eq!(interruption["unitIds"], json!(["g4"]));
    assert_eq!(interruption["terminatesAt"], at(w.plus(90)));
    // A's longer notice again changes nothing.
    let again = w.reclaim(&w.a, &["g3"], Some(3600));
    assert_eq!(again["terminatesAt"][&spot], at(w.plus(90)));

    w.freeze(w.plus(90));
    assert_eq!(w.vm(&w.buyer, &spot)["status"], "terminated");
    // Both units are free: the audience places on both at once.
    place_vm(&w.audience, NODE, &["g3", "g4"], "verified").created_id();
}

#[test]
fn notice_and_until_are_checked_and_refused_as_problems() {
    let w = World::open();
    let reclaim = w.path(&w.a, "reclaim");
    for op in ["reclaim", "reclaim/dry-run"] {
        let path = w.path(&w.a, op);
        for bad in [json!(3601), json!(-1)] {
            let problem = w
                .owner
                .post(&path, &json!({ "unitIds": ["g1"], "noticeSeconds": bad }))
                .expect_problem(422, "invalid-field");
            assert_eq!(problem["field"], "noticeSeconds", "{problem}");
        }
        w.owner
            .post(
                &path,
                &json!({ "unitIds": ["g1"], "noticeSeconds": "soon" }),
            )
            .expect_problem(400, "invalid-type");
        w.owner
            .post(
                &path,
                &json!({ "unitIds": ["g1"], "until": rfc3339_from_now(60) }),
            )
            .expect_problem(400, "unknown-field");
    }
    // The boundaries of the range are accepted.
    for notice in [0, 3600] {
        w.owner
            .post(
                &reclaim,
                &json!({ "unitIds": ["g1"], "noticeSeconds": notice }),
            )
            .expect_status(200);
    }
    // A key without reservation.capacity learns nothing from a bad notice: 404.
    w.audience
        .post(
            &reclaim,
            &json!({ "unitIds": ["g1"], "noticeSeconds": 99_999 }),
        )
        .expect_problem(404, "not-found");

    let release = w.path(&w.a, "release");
    w.owner
        .post(&release, &json!({ "unitIds": ["g1"], "noticeSeconds": 60 }))
        .expect_problem(400, "unknown-field");
    for (until, why) in [
        (at(w.now), "now is not in the future"),
        (at(w.now - TimeDelta::seconds(1)), "the past"),
        ("tomorrow".to_owned(), "not a time"),
    ] {
        let problem = w
            .owner
            .post(&release, &json!({ "unitIds": ["g1"], "until": until }))
            .expect_problem(422, "invalid-field");
        assert_eq!(problem["field"], "until", "{why}: {problem}");
    }
    let after_the_term =
        DateTime::parse_from_rfc3339(&w.a_ends_at).expect("endsAt") + TimeDelta::milliseconds(1);
    let problem = w
        .owner
        .post(
            &release,
            &json!({ "unitIds": ["g1"], "until": after_the_term.to_rfc3339() }),
        )
        .expect_problem(422, "invalid-field");
    assert_eq!(problem["field"], "until");
    // Nothing of the refused requests was written.
    assert_eq!(w.reservation(&w.a)["releasedUnitIds"], json!([]));
}

#[test]
fn without_notice_or_until_a_reclaim_terminates_at_once_and_a_release_never_lapses() {
    let w = World::open();
    w.release(&w.a, &["g1", "g2"], None);
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();
    let dry = w.dry_run(&w.a, &["g1"], None);
    assert!(dry.get("terminatesAt").is_none());
    let reclaimed = w.reclaim(&w.a, &["g1"], None);
    assert_eq!(strings(&reclaimed["terminated"]), vec![spot.clone()]);
    assert!(reclaimed.get("terminatesAt").is_none());
    assert!(reclaimed.get("releasedUntil").is_none());
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["status"], "terminated");
    assert_eq!(vm["terminationReason"], "reclaimed");
    assert!(vm.get("interruption").is_none());
    // A release without until is open-ended: still released a year on (B never ends).
    let released = w.release(&w.b, &["g4"], None);
    assert!(released.get("releasedUntil").is_none(), "{released}");
    w.freeze(w.plus(365 * 86_400));
    assert_eq!(strings(&w.reservation(&w.b)["releasedUnitIds"]), vec!["g4"]);
}

#[test]
fn a_timed_release_gives_its_units_back_by_itself() {
    let w = World::open();
    let until = at(w.plus(3600));
    let released = w.release(&w.a, &["g1", "g2"], Some(&until));
    assert_eq!(strings(&released["releasedUnitIds"]), vec!["g1", "g2"]);
    assert_eq!(
        released["releasedUntil"],
        json!({ "g1": until, "g2": until })
    );
    assert_eq!(
        w.reservation(&w.a)["releasedUntil"],
        released["releasedUntil"]
    );
    // Buyers see when the units stop being for sale.
    assert_eq!(
        w.market_units(),
        vec![
            ("g1".to_owned(), Some(until.clone())),
            ("g2".to_owned(), Some(until.clone()))
        ]
    );
    // A spot VM placed there knows its deadline before anything happens.
    let placed = place_vm(&w.buyer, NODE, &["g1"], "spot")
        .expect_status(201)
        .json();
    let spot = placed["id"].as_str().expect("id").to_owned();
    assert_eq!(
        placed["interruption"],
        json!({
            "reason": "release-ends",
            "noticedAt": at(w.now),
            "terminatesAt": until,
            "unitIds": ["g1"],
        })
    );
    // Non-spot VMs are still kept off until the release ends.
    place_vm(&w.audience, NODE, &["g2"], "community").expect_problem(409, "placement-refused");

    // The millisecond before `until`: released, running.
    w.freeze(w.plus(3600) - TimeDelta::milliseconds(1));
    assert_eq!(
        strings(&w.reservation(&w.a)["releasedUnitIds"]),
        vec!["g1", "g2"]
    );
    assert_eq!(w.vm(&w.buyer, &spot)["status"], "running");

    // At `until`: the units are the reservation's again, the VM has stopped.
    w.freeze(w.plus(3600));
    let reservation = w.reservation(&w.a);
    assert_eq!(reservation["releasedUnitIds"], json!([]));
    assert!(reservation.get("releasedUntil").is_none(), "{reservation}");
    assert!(w.market_units().is_empty());
    let vm = w.vm(&w.buyer, &spot);
    assert_eq!(vm["status"], "terminated");
    assert_eq!(vm["terminationReason"], "release-ended");
    assert_eq!(vm["terminatedAt"], until);
    // The audience places again on both units (the database agrees the release ended).
    place_vm(&w.audience, NODE, &["g1", "g2"], "community").created_id();
    // Releasing them again is a new release: refused while a community VM runs there.
    w.owner
        .post(&w.path(&w.a, "release"), &json!({ "unitIds": ["g1"] }))
        .expect_problem(409, "units-not-idle");
}

#[test]
fn a_reclaim_before_until_still_gives_notice_and_until_may_be_the_end_of_the_term() {
    let w = World::open();
    // `until` at the end of the term itself is accepted.
    let released = w.release(&w.a, &["g1"], Some(&w.a_ends_at));
    assert_eq!(released["releasedUntil"], json!({ "g1": w.a_ends_at }));
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();
    assert_eq!(
        w.vm(&w.buyer, &spot)["interruption"]["terminatesAt"],
        json!(w.a_ends_at)
    );
    // A reclaim with notice before `until` shortens the deadline.
    let reclaimed = w.reclaim(&w.a, &["g1"], Some(120));
    assert_eq!(reclaimed["terminatesAt"][&spot], at(w.plus(120)));
    let interruption = w.vm(&w.buyer, &spot)["interruption"].clone();
    assert_eq!(interruption["reason"], "reclaimed");
    assert_eq!(interruption["terminatesAt"], at(w.plus(120)));
    assert_eq!(w.reservation(&w.a)["releasedUnitIds"], json!([]));

    // A release with until over a running spot VM gives it that deadline (never a later one).
    w.release(&w.a, &["g2"], None);
    let early = place_vm(&w.buyer, NODE, &["g2"], "spot").created_id();
    let bounded = w.release(&w.a, &["g2"], Some(&at(w.plus(900))));
    assert_eq!(bounded["terminatesAt"], json!({ &early: at(w.plus(900)) }));
    // The buyer hears of it in its feed: only its own VM and the deadline.
    let (items, _) = poll(&w.buyer, "");
    let release = items
        .iter()
        .find(|e| e["action"] == "reservation.release")
        .expect("the bounding release reaches the buyer's feed");
    assert_eq!(release["view"], "own-vms");
    assert_eq!(release["deadlines"], json!({ &early: at(w.plus(900)) }));
    assert!(release.get("reservationId").is_none(), "{release}");
    let later = w.release(&w.a, &["g2"], Some(&at(w.plus(1800))));
    assert_eq!(later["terminatesAt"], json!({ &early: at(w.plus(900)) }));
    assert_eq!(
        w.vm(&w.buyer, &early)["interruption"]["terminatesAt"],
        at(w.plus(900))
    );
}

/// One poll of the feed: (items, nextCursor).
fn poll(client: &Client, query: &str) -> (Vec<Value>, String) {
    let page = client
        .get(&format!("/v1/events{query}"))
        .expect_status(200)
        .json();
    (
        page["items"].as_array().expect("items").clone(),
        page["nextCursor"].as_str().expect("nextCursor").to_owned(),
    )
}

fn actions(items: &[Value]) -> Vec<String> {
    items
        .iter()
        .map(|e| e["action"].as_str().expect("action").to_owned())
        .collect()
}

#[test]
fn the_feed_tells_each_org_what_happens_to_its_vms_and_capacity() {
    let w = World::open();
    w.release(&w.a, &["g1"], None);
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();

    // The buyer sees its placement; the owner the release (and, as capacity owner, the
    // placement on its units); an org with no part, nothing.
    let (buyer_items, buyer_cursor) = poll(&w.buyer, "");
    assert_eq!(actions(&buyer_items), vec!["vm.place"]);
    assert_eq!(buyer_items[0]["vmId"], json!(spot));
    let (owner_items, owner_cursor) = poll(&w.owner, "");
    assert_eq!(
        actions(&owner_items),
        vec!["reservation.release", "vm.place"]
    );
    let (nothing, other_cursor) = poll(&w.other_buyer, "");
    assert!(nothing.is_empty(), "{nothing:?}");
    // Nothing new: an empty page that resumes where it stood.
    let (again, cursor) = poll(&w.buyer, &format!("?after={buyer_cursor}"));
    assert!(again.is_empty());
    assert_eq!(cursor, buyer_cursor);

    // A long poll waiting for the buyer's next event gets the notice when it comes.
    let waiting = {
        let buyer = w.buyer.clone();
        let cursor = buyer_cursor.clone();
        std::thread::spawn(move || poll(&buyer, &format!("?after={cursor}&wait=30")))
    };
    w.reclaim(&w.a, &["g1"], Some(600));
    let (items, next) = waiting.join().expect("the long poll");
    assert_eq!(actions(&items), vec!["reservation.reclaim"]);
    // The buyer is no party of the reservation: it sees only its own VM's notice.
    assert_eq!(items[0]["view"], "own-vms");
    assert_eq!(items[0]["terminated"], json!([spot]));
    assert_eq!(items[0]["deadlines"], json!({ &spot: at(w.plus(600)) }));
    for hidden in ["reservationId", "reason", "actorKeyId", "actorOrgId"] {
        assert!(items[0].get(hidden).is_none(), "{hidden}: {}", items[0]);
    }
    // The owner sees the whole reclaim, the reason and the deadline included.
    let (owner_new, _) = poll(&w.owner, &format!("?after={owner_cursor}"));
    assert_eq!(actions(&owner_new), vec!["reservation.reclaim"]);
    assert_eq!(owner_new[0]["reservationId"], json!(w.a));
    assert_eq!(owner_new[0]["reason"], "training starts");
    assert_eq!(owner_new[0]["deadlines"], json!({ &spot: at(w.plus(600)) }));
    // Resuming after it gives nothing twice; the stranger still sees nothing.
    assert!(poll(&w.buyer, &format!("?after={next}")).0.is_empty());
    assert!(
        poll(&w.other_buyer, &format!("?after={other_cursor}"))
            .0
            .is_empty()
    );
    // A short wait with nothing to come answers empty, at the same cursor.
    let (empty, same) = poll(&w.buyer, &format!("?after={next}&wait=1"));
    assert!(empty.is_empty());
    assert_eq!(same, next);

    // The buyer stops its VM: it sees its own termination.
    w.buyer
        .delete(&format!("/v1/vms/{spot}"))
        .expect_status(200);
    let (stop, _) = poll(&w.buyer, &format!("?after={next}"));
    assert_eq!(actions(&stop), vec!["vm.terminate"]);
    // Pages: limit 1 walks the owner's events one at a time, in order.
    let mut cursor = String::new();
    let mut walked = Vec::new();
    loop {
        let query = if cursor.is_empty() {
            "?limit=1".to_owned()
        } else {
            format!("?limit=1&after={cursor}")
        };
        let (items, next) = poll(&w.manager, &query);
        if items.is_empty() {
            break;
        }
        walked.extend(actions(&items));
        cursor = next;
    }
    assert_eq!(
        walked,
        vec![
            "reservation.release",
            "vm.place",
            "reservation.reclaim",
            "vm.terminate"
        ]
    );
}

#[test]
fn the_feed_refuses_bad_parameters_and_keys_without_a_read_permission() {
    let w = World::open();
    assert_invalid_parameters(
        &w.buyer,
        "/v1/events",
        &[
            ("?wait=31", "wait"),
            ("?wait=-1", "wait"),
            ("?wait=soon", "wait"),
            ("?after=abc", "after"),
            ("?after=-5", "after"),
        ],
    );
    w.buyer
        .get("/v1/events?cursor=1")
        .expect_problem(400, "unknown-parameter");
    w.app
        .anonymous()
        .get("/v1/events")
        .expect_problem(401, "unauthorized");
    let narrow = w.app.key(BUYER, "member", Some(&["node.read"]));
    narrow.get("/v1/events").expect_problem(403, "forbidden");
}

#[test]
fn a_vm_whose_notice_ran_out_no_longer_holds_its_unit_on_the_node() {
    let w = World::open();
    w.release(&w.a, &["g1"], None);
    let spot = place_vm(&w.buyer, NODE, &["g1"], "spot").created_id();
    w.reclaim(&w.a, &["g1"], Some(60));
    let without_g1: Vec<&str> = UNITS.iter().copied().filter(|u| *u != "g1").collect();
    let put = || {
        w.app.operator().put(
            &format!("/v1/nodes/{NODE}"),
            &json!({ "ownerOrgId": OWNER, "unitIds": without_g1 }),
        )
    };
    let problem = put().expect_problem(409, "units-in-use");
    assert_eq!(problem["unitIds"], json!(["g1"]));
    w.freeze(w.plus(60));
    put().expect_status(200);
    assert_eq!(w.vm(&w.buyer, &spot)["status"], "terminated");
}
