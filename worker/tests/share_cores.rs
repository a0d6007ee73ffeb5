//! `share_cores::yield_to_servers` lowers every thread of the process, those
//! made before the call and those made after, to one nice value, leaves a
//! thread already lower where it is, and never goes past the lowest
//! priority. (A test binary of its own: the call lowers the whole process.)

use std::sync::mpsc;

use ps_worker::share_cores::{current_nice, yield_to_servers};

/// A thread that waits for a word, then reports its nice value; `first`
/// lowers it to that value before it waits (None: left as made).
fn waiting_thread(first: Option<i32>) -> (mpsc::Sender<()>, std::thread::JoinHandle<i32>) {
    let (go, wait) = mpsc::channel::<()>();
    let (ready, set) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        if let Some(nice) = first {
            rustix::process::setpriority_process(None, nice).unwrap();
        }
        ready.send(()).unwrap();
        wait.recv().unwrap();
        current_nice().unwrap()
    });
    set.recv().unwrap();
    (go, thread)
}

#[test]
fn every_thread_is_lowered_to_one_value_a_lower_one_is_left_and_19_is_the_floor() {
    let before = current_nice().unwrap();
    assert!(before + 10 <= 19, "run the tests at nice 9 or lower");
    let (go_earlier, earlier) = waiting_thread(None);
    let (go_lower, lower) = waiting_thread(Some(before + 10));
    let lowered = yield_to_servers(3).unwrap();
    assert_eq!(lowered, before + 3);
    assert_eq!(current_nice().unwrap(), lowered, "the calling thread");
    go_earlier.send(()).unwrap();
    assert_eq!(
        earlier.join().unwrap(),
        lowered,
        "a thread made before the call"
    );
    go_lower.send(()).unwrap();
    assert_eq!(
        lower.join().unwrap(),
        before + 10,
        "a thread lower already is left"
    );
    let later = std::thread::spawn(|| current_nice().unwrap());
    assert_eq!(
        later.join().unwrap(),
        lowered,
        "a thread made after the call"
    );
    assert_eq!(
        yield_to_servers(19).unwrap(),
        19,
        "held at the lowest priority"
    );
}
