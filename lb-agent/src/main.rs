fn main() {
    println!("{}", lb_agent::EBPF_OBJECT.len());
}
